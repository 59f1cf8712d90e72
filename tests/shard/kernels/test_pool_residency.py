"""A KV pool made resident in the background: every page faulted in without a byte of it written
(slots a step wrote before keep their values), on a thread that waits its delay first, and a pool
freed before its turn is skipped."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from mohawk_shard.kernels.huge_pages import lazy_zeros
from mohawk_shard.kernels.pool_residency import populate, populate_later
from tests.shard.kernels.test_huge_pages import smaps_kib_at

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc")
POOL_KIB = 64 << 10  # a 64 MiB layer of keys


def pool() -> torch.Tensor:
    return lazy_zeros(4, (POOL_KIB << 10) // (4 * 64 * 2), 64, dtype=torch.float16)


def test_every_page_is_faulted_in_and_what_steps_wrote_stays() -> None:
    keys = pool()
    keys[2, 100:108] = 3.0  # a step wrote these slots before
    assert smaps_kib_at(keys.data_ptr(), "Rss:") < 1024
    if not populate(keys):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    assert smaps_kib_at(keys.data_ptr(), "Rss:") >= POOL_KIB
    assert keys[2, 100:108].eq(3.0).all() and keys.sum().item() == 3.0 * 8 * 64


def test_in_the_background_after_its_delay_and_a_freed_pool_is_skipped() -> None:
    kept, dropped = pool(), pool()
    if not populate(lazy_zeros(4, 4096, 64, dtype=torch.float16)):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    gone = weakref.ref(dropped)
    reports: list[tuple[int, float]] = []
    thread = populate_later([dropped, kept], 3.0, done=lambda size, took: reports.append((size, took)))
    assert smaps_kib_at(kept.data_ptr(), "Rss:") < 1024  # still waiting out its delay
    del dropped  # the plan moved on before the populate's turn
    gc.collect()  # (slow in a big test process: the delay is ample for it)
    assert gone() is None  # the thread does not keep it
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert smaps_kib_at(kept.data_ptr(), "Rss:") >= POOL_KIB
    assert [size for size, _ in reports] == [POOL_KIB << 10]  # the freed one counted nothing
