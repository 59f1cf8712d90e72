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
from mohawk_shard.kernels.pool_residency import populate, populate_later, reuse_prefix
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


def test_a_smaller_pool_reuses_the_resident_start_and_gives_the_tail_back() -> None:
    keys = pool()
    if not populate(keys):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    half = reuse_prefix(keys, (2, keys.shape[1], 64))
    assert half is not None and half.data_ptr() == keys.data_ptr() and half.is_contiguous()
    assert smaps_kib_at(half.data_ptr(), "Rss:") <= POOL_KIB // 2 + 4  # the tail went back
    assert reuse_prefix(keys, (8, keys.shape[1], 64)) is None  # larger: a fresh pool
    assert reuse_prefix(keys.transpose(0, 1), (1, 64)) is None  # not contiguous


def test_a_backend_allocated_again_in_place_reuses_its_pool_and_a_copy_does_not(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from mohawk_shard.backends import make_backend
    from mohawk_shard.node.handover import share_weights
    from tests.shard.engine import test_architectures as architectures

    source = architectures.tiny_source(tmp_path_factory)
    backend = make_backend("torch", source, 0, source.config.num_layers, device="cpu")
    backend.allocate_kv_cache(4096, 16)
    first = [c.key.data_ptr() for c in backend.kv_caches]
    beside = share_weights(backend)
    beside.allocate_kv_cache(2048, 16)
    assert [c.key.data_ptr() for c in backend.kv_caches] == first  # the running pool is untouched
    assert not {c.key.data_ptr() for c in beside.kv_caches} & set(first)
    backend.allocate_kv_cache(2048, 16)  # in place, smaller: the same memory
    assert [c.key.data_ptr() for c in backend.kv_caches] == first
    assert backend.kv_caches[0].key.shape[1] == 2048 * 16
    backend.allocate_kv_cache(8192, 16)  # larger: a fresh pool
    assert not {c.key.data_ptr() for c in backend.kv_caches} & set(first)


def test_a_populated_pool_is_on_huge_pages_where_the_kernel_lends_them() -> None:
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("this kernel lends no transparent huge pages")
    keys = pool()
    keys[0, :8] = 1.0  # a step wrote the first page before (it stays a small one)
    assert smaps_kib_at(keys.data_ptr(), "AnonHugePages:") == 0
    if not populate(keys):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    assert smaps_kib_at(keys.data_ptr(), "AnonHugePages:") >= POOL_KIB // 2
    assert keys[0, :8].eq(1.0).all() and keys.sum().item() == 8 * 64
