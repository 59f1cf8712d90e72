"""The KV budget rule (`kv_budget.py`), as the setting's description states it: a node's is a
quarter of its memory limit, on CPU at most 1 GiB (a CUDA node is not capped at 1 GiB); the
in-process engine's is 1 GiB on CPU and 60% of the free CUDA memory; the setting wins over both."""

from __future__ import annotations

from mohawk_shard.config import EngineSettings
from mohawk_shard.kv_budget import MIB, local_kv_budget_mb, node_kv_budget_bytes

GIB = 1024 * MIB


def test_a_node_takes_a_quarter_of_its_limit_capped_at_1_gib_on_cpu_only() -> None:
    assert node_kv_budget_bytes(None, 2 * GIB, "cpu") == GIB // 2
    assert node_kv_budget_bytes(None, 64 * GIB, "cpu") == GIB
    assert node_kv_budget_bytes(None, 64 * GIB, "cuda:0") == 16 * GIB  # an H100 node: not 1 GiB
    assert node_kv_budget_bytes(300, 64 * GIB, "cuda:0") == 300 * MIB


def test_one_process_takes_1_gib_on_cpu_and_60_percent_of_free_cuda() -> None:
    assert local_kv_budget_mb(None, "cpu", None) == 1024
    assert local_kv_budget_mb(None, "cuda:0", 10 * GIB) == 6 * 1024  # 60% of 10 GiB, in MiB
    assert local_kv_budget_mb(512, "cuda:0", 10 * GIB) == 512


def test_the_setting_says_so() -> None:
    described = EngineSettings.model_fields["kv_cache_memory_mb"].description or ""
    for words in ("a quarter of its memory limit", "at most 1024", "60% of the memory free"):
        assert words in " ".join(described.split()), words
