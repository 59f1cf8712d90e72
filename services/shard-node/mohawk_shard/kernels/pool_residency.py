"""A KV pool made resident in the background, after its stage has started serving.

Design. `lazy_zeros` maps a KV pool untouched, so a stage loads at once (a failover's critical
path) and a step faults in only the small pages it writes. Left at that, a pool becomes resident
bit by bit for as long as the node serves: the block manager hands out blocks never used before
ahead of freed ones (a freed block keeps its prefix-cache entry as long as it can), so a steady
load touches the whole pool over minutes, and the node's RSS grows by the pool's size while it
serves (the 1,000-session load test: the shard 33% over its working set at the end, a 1 GiB pool
filling). A pool is a fixed allocation, so the node faults all of it in once, `delay_s` after the
stage loads (a failover's resume first), on a thread of its own at the lowest priority:
`madvise(MADV_POPULATE_WRITE)` (Linux 5.14) maps every page writable without writing it, so the
slots steps have written meanwhile keep their contents, a chunk at a time. Before it does, it asks
for huge pages over the pool (`MADV_HUGEPAGE`): the pool was mapped on small pages so that a fresh
one's first writes fault in 4 KiB each (`huge_pages.lazy_zeros`), but once all of it is made
resident that reason is gone, and the 2 MiB regions no step touched yet come in as huge pages. A
process holding a populated pool on small pages takes that much longer to die: a SIGKILLed child
with 2 GiB populated closed its socket 155-160 ms after the signal on small pages, 6-8 ms on huge
ones (a scratch script, this VM), and nats-server hears of a killed node only once its socket
closes, so a failover's detection waited out the teardown of the dead node's pool. A tensor
freed meanwhile (the plan moved on) is skipped; where the kernel has no such advice, nothing is
populated and the pool stays lazy.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the node imports this module (`lowest_priority`) without loading torch
    import torch

MADV_POPULATE_WRITE = 23  # linux/mman.h; Python's mmap module does not name it
MADV_HUGEPAGE = 14
PAGE = 4096
HUGE_PAGE = 2 << 20
CHUNK_BYTES = 64 << 20  # one madvise call's worth
RESIDENT_AFTER_S = 5.0  # a pool is populated this long after its stage loaded: a failover's resume first


def _madvise() -> Callable[[int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name, use_errno=True) if name is not None else None
    function = getattr(libc, "madvise", None)
    if function is None:
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_MADVISE = _madvise()


def lowest_priority() -> None:
    """Nice 19 for the calling thread (Linux keeps nice per thread, and the threads torch starts
    from it inherit it): a background thread takes only the CPU that serving leaves."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def populate(tensor: torch.Tensor) -> bool:
    """Fault every page of `tensor`'s memory in, writable, without writing it; False where the
    kernel cannot (no such advice, not a CPU tensor)."""
    if _MADVISE is None or tensor.device.type != "cpu":
        return False
    start = tensor.data_ptr() // PAGE * PAGE
    end = tensor.data_ptr() + tensor.numel() * tensor.element_size()
    huge_from = (tensor.data_ptr() + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    huge_to = end // HUGE_PAGE * HUGE_PAGE
    if huge_to > huge_from:  # refused (THP off): small pages, as mapped
        _MADVISE(huge_from, huge_to - huge_from, MADV_HUGEPAGE)
    for at in range(start, end, CHUNK_BYTES):
        length = (min(end, at + CHUNK_BYTES) - at + PAGE - 1) // PAGE * PAGE
        if _MADVISE(at, length, MADV_POPULATE_WRITE) != 0:
            return False
    return True


MADV_DONTNEED = 4


def reuse_prefix(old: torch.Tensor, shape: Sequence[int]) -> torch.Tensor | None:
    """A tensor of `shape` over the start of `old`'s memory (contiguous, the same dtype), the rest
    of it given back to the OS; None when `old` is too small or not contiguous. The contents are
    `old`'s, not zeros: for a KV pool, whose every slot is written before it is read."""
    count = math.prod(shape)
    if not old.is_contiguous() or old.numel() < count:
        return None
    flat = old.view(-1)
    if _MADVISE is not None and old.device.type == "cpu":  # the tail back to the OS
        tail = (flat.data_ptr() + count * old.element_size() + PAGE - 1) // PAGE * PAGE
        end = (flat.data_ptr() + old.numel() * old.element_size()) // PAGE * PAGE
        if end > tail:
            _MADVISE(tail, end - tail, MADV_DONTNEED)
    return flat[:count].view(*shape)


def populate_later(
    tensors: Sequence[torch.Tensor], delay_s: float, done: Callable[[int, float], None] | None = None
) -> threading.Thread:
    """Populate `tensors` on a thread of their own at the lowest priority, `delay_s` from now,
    holding each only while it is populated; then `done(bytes populated, seconds it took)`, also
    when nothing could be (0 bytes)."""
    refs = [weakref.ref(t) for t in tensors]

    def run() -> None:
        time.sleep(delay_s)
        started, populated = time.monotonic(), 0
        lowest_priority()
        for ref in refs:
            tensor = ref()
            if tensor is None:
                continue
            if not populate(tensor):
                break  # the kernel cannot: the rest would fail alike
            populated += tensor.numel() * tensor.element_size()
            del tensor
        if done is not None:
            done(populated, time.monotonic() - started)

    thread = threading.Thread(target=run, name="kv-populate", daemon=True)
    thread.start()
    return thread
