"""`freeze_long_lived`: what lives at the end of start-up leaves the collector's walks; what is made
after is collected as before, cycles included."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from mohawk_common.long_lived import freeze_long_lived


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def unfrozen_after() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test session's objects go back where they were


def test_start_up_objects_are_frozen_and_later_cycles_still_collected(unfrozen_after: None) -> None:
    start_up = [{"vocab": [i]} for i in range(10_000)]  # long-lived: a tokenizer's tables, say
    garbage = Node()
    garbage.other = Node()
    garbage.other.other = garbage  # a cycle already unreachable at the end of start-up ...
    gone_before = weakref.ref(garbage)
    del garbage

    frozen = freeze_long_lived()
    assert gone_before() is None  # ... is collected first, not frozen
    assert frozen >= len(start_up) * 2  # each dict and its list
    assert gc.get_freeze_count() == frozen

    later = Node()  # a request's objects: a cycle made after start-up
    later.other = Node()
    later.other.other = later
    gone_later = weakref.ref(later)
    del later
    gc.collect()
    assert gone_later() is None
    assert start_up[-1] == {"vocab": [9_999]}
