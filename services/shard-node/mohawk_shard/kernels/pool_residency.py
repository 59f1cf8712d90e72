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
slots steps have written meanwhile keep their contents, a chunk at a time. A tensor freed meanwhile
(the plan moved on) is skipped; where the kernel has no such advice, nothing is populated and the
pool stays lazy.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the node imports this module (`lowest_priority`) without loading torch
    import torch

MADV_POPULATE_WRITE = 23  # linux/mman.h; Python's mmap module does not name it
PAGE = 4096
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
    for at in range(start, end, CHUNK_BYTES):
        length = (min(end, at + CHUNK_BYTES) - at + PAGE - 1) // PAGE * PAGE
        if _MADVISE(at, length, MADV_POPULATE_WRITE) != 0:
            return False
    return True


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
