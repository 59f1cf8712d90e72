"""Giving the heap memory a busy stretch freed back to the OS once a process goes idle.

Design. A step allocates and frees many large tensors. glibc serves them from mmap at first, but
each free of an mmapped block raises its mmap threshold to that block's size (up to 32 MiB on
64-bit), so from then on blocks of that size come from the heap's arenas, and freed arena memory
stays mapped: a node's RSS keeps the peak of its busiest step long after the load is gone (the
1,000-session load test saw a shard 18% up after it ended). `malloc_trim(0)` returns the free
pages of every arena to the OS in a few milliseconds. The node calls it once per idle period: when
its step counter has not moved for `idle_s` and has moved since the last trim, so a busy node
never trims between steps and an idle one trims once. A gateway does the same with its count of
requests started and ended, counting no time idle while a request is in flight (one answer of a
few seconds on a big model outlasted the idle period, and the collection and trim took a core
from the nodes mid-answer), and first collects its cyclic garbage: a request's objects refer to
each other (its token stream calls back into it), so they wait for the cycle collector, which
runs on allocations and so not at all once the gateway is idle (the 1,000-session load test left
~2,100 requests' objects, 17 MiB of Python objects, in an idle gateway). Where the C library has
no `malloc_trim` (macOS, musl), nothing is trimmed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def load_malloc_trim() -> Callable[[], None] | None:
    """glibc's `malloc_trim(0)`, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def _trim() -> None:
        trim(0)

    return _trim


class IdleTrim:
    """Decides when to trim: `due(activity, now)` with a counter that grows with every step."""

    def __init__(self, idle_s: float = 2.0) -> None:
        self.idle_s = idle_s
        self._activity = 0
        self._changed_at = 0.0
        self._trimmed = True  # nothing to give back before the first step
        self.num_trims = 0

    def due(self, activity: int, now: float, *, busy: bool = False) -> bool:
        """Whether to trim now; `busy`: work is under way even if the counter has not moved (a
        gateway streaming one long answer), which keeps the idle period from starting."""
        if busy or activity != self._activity:
            self._activity, self._changed_at, self._trimmed = activity, now, False
            return False
        if self._trimmed or now - self._changed_at < self.idle_s:
            return False
        self._trimmed = True
        self.num_trims += 1
        return True
