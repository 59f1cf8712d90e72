"""Weights on 2 MiB pages: aligned, writable, really on huge pages where the kernel lends them, and
all of their memory back to the OS when they go; a KV pool that costs only the small pages written."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from mohawk_shard.kernels.huge_pages import HUGE_PAGE, MIN_BYTES, huge_empty, lazy_zeros

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def rss_kib() -> int:
    return next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS")
    )


def huge_kib_at(address: int) -> int:
    """AnonHugePages of the mapping holding `address` (/proc/self/smaps)."""
    return smaps_kib_at(address, "AnonHugePages:")


def smaps_kib_at(address: int, field: str) -> int:
    """`field` (kB) of the mapping holding `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and head == field:
            return int(line.split()[1])
    return 0


def test_a_large_tensor_is_aligned_writable_and_the_shape_asked() -> None:
    t = huge_empty(3, MIN_BYTES // 4, dtype=torch.float16)
    assert t.shape == (3, MIN_BYTES // 4) and t.dtype == torch.float16 and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0
    t.fill_(1.5)
    assert t.sum(dtype=torch.float64).item() == 1.5 * t.numel()


def test_a_small_tensor_is_an_ordinary_one() -> None:
    t = huge_empty(16, 16, dtype=torch.float32)
    assert t.shape == (16, 16) and t.untyped_storage().nbytes() == 16 * 16 * 4


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc")
def test_its_memory_goes_back_when_it_goes() -> None:
    gc.collect()
    before = rss_kib()
    tensors = [huge_empty(64 << 20, dtype=torch.uint8).fill_(1) for _ in range(4)]
    assert rss_kib() - before >= 4 * 60 * 1024
    del tensors
    gc.collect()
    assert rss_kib() - before < 16 * 1024


@pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(), reason="transparent huge pages are off on this kernel"
)
def test_it_is_on_huge_pages_where_the_kernel_lends_them() -> None:
    t = huge_empty(32 << 20, dtype=torch.uint8).fill_(1)
    assert huge_kib_at(t.data_ptr()) > 0


def test_zeros_read_as_zeros_and_cost_no_memory_until_written() -> None:
    gc.collect()
    before = rss_kib()
    pool = lazy_zeros(2, 64 * MIN_BYTES // 2, dtype=torch.float16)  # 256 MiB, as a KV pool
    assert rss_kib() - before < 16 * 1024  # nothing written: no page faulted in
    assert pool.data_ptr() % HUGE_PAGE == 0 and not pool.any()
    pool[1, -1] = 2.0
    assert pool.sum().item() == 2.0
    small = lazy_zeros(4, 4, dtype=torch.float32)
    assert small.shape == (4, 4) and not small.any()


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc")
def test_a_step_writing_a_few_slots_of_each_head_faults_in_small_pages_only() -> None:
    """A prefill writes a few slots at the start of each head's run of the pool: on 2 MiB pages
    each write faulted in a whole huge page (the 135M's first step after a failover, 144 MiB)."""
    heads, slots, width = 3, 64 * 1024, 64  # one layer's keys, 24 MiB at fp16
    pool = lazy_zeros(heads, slots, width, dtype=torch.float16)
    pool.index_copy_(1, torch.arange(108), torch.ones(heads, 108, width, dtype=torch.float16))
    assert smaps_kib_at(pool.data_ptr(), "Rss:") <= 3 * 16  # 3 heads x 108 slots x 128 bytes: 4 pages each
    assert huge_kib_at(pool.data_ptr()) == 0
    assert pool[:, :108].all() and not pool[:, 108:].any()
