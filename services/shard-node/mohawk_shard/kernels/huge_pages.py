"""Weights and KV caches on 2 MiB pages, where the kernel lends them (Linux transparent huge pages).

Design. A batch-1 decode step reads every weight once, from memory: on a 1.7B Q4_K_M file about
1.1 GB a token. On 4 KiB pages that is 270,000 pages a step, each a TLB miss and a page walk, and
the CPU's prefetchers stop at every page's end. Linux backs anonymous memory with 2 MiB pages only
where a process asks (`/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` on Debian), so
`huge_empty` maps a tensor's memory of its own (an anonymous `mmap`, 2 MiB-aligned) and asks for
huge pages over it (`madvise(MADV_HUGEPAGE)`) before anything touches it: the first writes (the
load's repack, the cache's first writes) fault it in 2 MiB pages, and when the tensor goes the mapping
is unmapped, all of it back to the OS. (Asking over memory malloc handed out instead left the
flag on its heap: later small allocations there faulted 2 MiB pages each, and a process that
built and dropped a 1.7B engine a dozen times grew to 24 GB and was killed.) torch's own switch
(`THP_MEM_ALLOC_ENABLE`) does this for every large allocation, activations included, and only
when set before torch's first allocation; here it is the long-lived tensors alone. Measured on
the 1.7B Q4_K_M, batch-1 (a scratch script, three processes each): 33.9-34.1 tok/s with huge
pages against 30.3-32.5 without. Small tensors, and platforms without `madvise` (macOS), get an
ordinary tensor: the same numbers, on small pages.
"""

from __future__ import annotations

import contextlib
import math
import mmap

import torch

HUGE_PAGE = 2 << 20
MIN_BYTES = 2 * HUGE_PAGE  # smaller tensors would round up to a huge page's worth of memory


def huge_empty(*shape: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """`torch.empty(shape, dtype=dtype, device=device)`, on huge pages where a CPU tensor can be."""
    mapped = _mapped(shape, dtype, device)
    return mapped if mapped is not None else torch.empty(*shape, dtype=dtype, device=device)


def huge_zeros(*shape: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """`torch.zeros(...)`, on huge pages where a CPU tensor can be. A fresh anonymous mapping reads
    as zeros already (the kernel hands out zeroed pages on first touch), so it is not written: a
    KV pool costs its pages as steps fill them, and allocating one takes no time (zeroing a 1 GiB
    pool here took 0.14-0.75 s, on the critical path of every failover's load)."""
    mapped = _mapped(shape, dtype, device)
    return mapped if mapped is not None else torch.zeros(*shape, dtype=dtype, device=device)


def _mapped(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor | None:
    """A tensor over an anonymous mapping of its own with huge pages asked for; None where not (a
    device tensor, a small one, a platform without `madvise`)."""
    count = math.prod(shape)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    if torch.device(device).type != "cpu" or nbytes < MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    # private and anonymous (a shared mapping is shmem, which THP leaves alone): unmapped when the tensor goes
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    offset = _aligned_offset(mapping)
    with contextlib.suppress(OSError):  # refused: small pages, the same numbers
        mapping.madvise(mmap.MADV_HUGEPAGE, offset, nbytes // HUGE_PAGE * HUGE_PAGE)
    return torch.frombuffer(mapping, dtype=dtype, count=count, offset=offset).view(*shape)


def _aligned_offset(mapping: mmap.mmap) -> int:
    """Bytes from the mapping's start to its first 2 MiB boundary."""
    address = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    return -address % HUGE_PAGE
