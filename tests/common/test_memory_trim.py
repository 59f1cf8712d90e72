"""An idle process (shard node, gateway) gives the heap its busy stretch freed back to the OS, once per idle
period."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap

import pytest

from mohawk_common.memory_trim import IdleTrim, load_malloc_trim


def test_trims_once_the_step_counter_has_stood_still_for_idle_s() -> None:
    idle = IdleTrim(idle_s=2.0)
    assert not idle.due(0, 0.0) and not idle.due(0, 10.0)  # no step yet: nothing to give back
    assert not idle.due(5, 11.0)  # busy
    assert not idle.due(9, 12.0)
    assert not idle.due(9, 13.5)  # 1.5 s idle
    assert idle.due(9, 14.0)  # 2 s idle: trim
    assert not idle.due(9, 20.0)  # once per idle period
    assert not idle.due(12, 21.0) and not idle.due(12, 22.9)
    assert idle.due(12, 23.0)
    assert idle.num_trims == 2
    assert not idle.due(0, 30.0)  # a new role's counter restarts at 0: that is a change too
    assert idle.due(0, 32.0)


def test_busy_keeps_the_idle_period_from_starting() -> None:
    idle = IdleTrim(idle_s=2.0)
    assert not idle.due(1, 0.0)
    assert not idle.due(1, 5.0, busy=True)  # the counter stood still, but work was under way
    assert not idle.due(1, 6.5)  # idle since 5.0
    assert idle.due(1, 7.0)


@pytest.mark.skipif(load_malloc_trim() is None, reason="this C library has no malloc_trim")
def test_malloc_trim_gives_freed_heap_back() -> None:
    """A freed mmapped block raises glibc's mmap threshold, so later blocks of that size come from
    the heap and stay resident when freed; the trim returns them. In a fresh process, so the test
    sees only its own allocations."""
    probe = textwrap.dedent(
        """
        import ctypes, ctypes.util, psutil
        from mohawk_common.memory_trim import load_malloc_trim
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        size = 8 << 20
        libc.free(libc.malloc(size))  # an mmapped block: its free raises the threshold to 8 MiB
        rss = lambda: psutil.Process().memory_info().rss
        before = rss()
        blocks = [libc.malloc(size) for _ in range(32)]  # 256 MiB from the heap now
        for block in blocks:
            ctypes.memset(block, 1, size)
        for block in reversed(blocks[:-1]):
            libc.free(block)  # the last one stays, so the heap's top cannot shrink by itself
        freed = rss()
        load_malloc_trim()()
        trimmed = rss()
        print((freed - before) >> 20, (trimmed - before) >> 20)
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    freed_mb, trimmed_mb = map(int, out.split())
    assert freed_mb > 200  # freed, yet resident
    assert trimmed_mb < 32  # given back: only the block still in use stays


def test_no_trim_where_the_c_library_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert load_malloc_trim() is None
