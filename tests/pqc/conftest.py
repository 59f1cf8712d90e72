"""Fixtures for libs/pqc tests: a clock at a fixed instant, our root and a foreign one."""

from __future__ import annotations

import pytest

from tests.pqc.helpers import Clock, ScratchPki


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pki(clock: Clock) -> ScratchPki:
    return ScratchPki(clock)


@pytest.fixture
def other_pki(clock: Clock) -> ScratchPki:
    """A second, unrelated operator root: everything it signs is foreign to `pki`."""
    return ScratchPki(clock)
