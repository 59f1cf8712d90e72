"""Weights on 2 MiB pages, where the kernel lends them (Linux transparent huge pages), and KV
pools mapped untouched.

Design. A batch-1 decode step reads every weight once, from memory: on a 1.7B Q4_K_M file about 1.1
GB a token. On 4 KiB pages that is 270,000 pages a step, each a TLB miss and a page walk, and the
CPU's prefetchers stop at every page's end. Linux backs anonymous memory with 2 MiB pages only
where a process asks (`/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` on Debian), so
`huge_empty` maps a tensor's memory of its own (an anonymous `mmap`, 2 MiB-aligned) and asks for
huge pages over it (`madvise(MADV_HUGEPAGE)`) before anything touches it: the first writes (the
load's repack) fault it in 2 MiB pages, and when the tensor goes the mapping is unmapped, all of it
back to the OS. A KV pool is mapped the same way but on small pages, and left unwritten
(`lazy_zeros`): a step touches only the slots it writes. (Asking over memory malloc handed out
instead left the flag on its heap: later small allocations there faulted 2 MiB pages each, and a
process that built and dropped a 1.7B engine a dozen times grew to 24 GB and was killed.) torch's
own switch (`THP_MEM_ALLOC_ENABLE`) does this for every large allocation, activations included, and
only when set before torch's first allocation; here it is the weights alone. Measured on the 1.7B
Q4_K_M, batch-1 (a scratch script, three processes each, weights and KV pool then both on huge
pages): 33.9-34.1 tok/s with huge pages against 30.3-32.5 without. Small tensors, and platforms
without `madvise` (macOS), get an ordinary tensor: the same numbers, on small pages.
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


def lazy_zeros(*shape: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """`torch.zeros(...)` that costs its memory only where it is written: a fresh anonymous mapping
    reads as zeros already (the kernel hands out zeroed pages on first touch), so it is not written
    (zeroing a 1 GiB KV pool here took 0.14-0.75 s, on the critical path of every failover's load).
    It is kept on 4 KiB pages (`MADV_NOHUGEPAGE`): a step writes a few slots of each head's run of
    the pool, and on 2 MiB pages each first write faulted in a whole huge page. The 135M's first
    prefill after a failover wrote 72 of them (144 MiB, 24 tensors of 3 heads) and took 300-430 ms
    against 28 ms on memory already touched (a scratch script, one backend of layers [0, 12), this
    VM, whose host backs a guest page only when it is first written); on small pages it writes a few
    hundred KiB. A KV step reads a block of 16 slots of a head at a time, 2 KiB at fp16 (64 wide),
    so huge pages spare the attention few TLB misses: the 135M whole, 8 sequences of 600 tokens
    decoding 40 steps, pools on huge and on small pages in turn, 4 runs each, gave 319 tok/s
    (median) on either (a scratch script, this VM). The weights, read whole every step, keep them.
    Once the pool is made resident whole (`pool_residency`, seconds after its stage loads), what no
    step touched yet comes in on huge pages."""
    mapped = _mapped(shape, dtype, device, huge=False)
    return mapped if mapped is not None else torch.zeros(*shape, dtype=dtype, device=device)


def _mapped(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, *, huge: bool = True
) -> torch.Tensor | None:
    """A tensor over an anonymous mapping of its own, with huge pages asked for (`huge`) or refused;
    None where not (a device tensor, a small one, a platform without `madvise`)."""
    count = math.prod(shape)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    if torch.device(device).type != "cpu" or nbytes < MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    # private and anonymous (a shared mapping is shmem, which THP leaves alone): unmapped when the tensor goes
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    offset = _aligned_offset(mapping)
    advice = mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE
    with contextlib.suppress(OSError):  # refused: small pages, the same numbers
        mapping.madvise(advice, offset, nbytes // HUGE_PAGE * HUGE_PAGE)
    return torch.frombuffer(mapping, dtype=dtype, count=count, offset=offset).view(*shape)


def _aligned_offset(mapping: mmap.mmap) -> int:
    """Bytes from the mapping's start to its first 2 MiB boundary."""
    address = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    return -address % HUGE_PAGE
