"""How much memory the KV cache gets when `kv_cache_memory_mb` is not set: the one rule, in one
place, for a shard node and for the engine in one process (`mohawk generate`, `build_local_engine`).

Design. The budget is fixed before the blocks are counted, and what is known then differs:
- A shard node sizes its cache before the planner has placed any weights on it, so it takes a
  share of its memory limit: a quarter, and on CPU at most `CPU_BUDGET_MB` (1 GiB), which holds
  tens of thousands of tokens of a small model and leaves a CPU host's RAM to its weights. The
  planner then places weights in what is left (`node/capacity.py`). (A CUDA node was capped at
  1 GiB as well, so an H100 node served from a 1 GiB cache; the cap is the CPU's only.)
- The engine in one process has loaded its weights already, so on CUDA it takes
  `CUDA_FREE_FRACTION` (60%) of the device memory still free, and on CPU the same 1 GiB.
So on a GPU a node takes a quarter of its limit and one process 60% of what its weights left: the
same idea from two vantage points, not one number. Making them one would move how many layers a
GPU node is given, which wants a GPU to measure; this session had none.
"""

from __future__ import annotations

MIB = 1 << 20
CPU_BUDGET_MB = 1024
NODE_LIMIT_SHARE = 4  # a node's cache: at most a quarter of its memory limit
CUDA_FREE_FRACTION = 0.6  # in one process on CUDA: of the device memory the weights left free


def node_kv_budget_bytes(kv_cache_memory_mb: int | None, limit_bytes: int, device: str) -> int:
    """A shard node's KV budget: the setting, else a quarter of its memory limit (on CPU at most
    1 GiB)."""
    if kv_cache_memory_mb:
        return kv_cache_memory_mb * MIB
    share = limit_bytes // NODE_LIMIT_SHARE
    return share if device.startswith("cuda") else min(CPU_BUDGET_MB * MIB, share)


def local_kv_budget_mb(kv_cache_memory_mb: int | None, device: str, free_bytes: int | None) -> int:
    """The in-process engine's KV budget in MiB: the setting, else 60% of the CUDA memory still
    free after its weights (`free_bytes`), else 1 GiB."""
    if kv_cache_memory_mb:
        return kv_cache_memory_mb
    if device.startswith("cuda") and free_bytes is not None:
        return int(free_bytes * CUDA_FREE_FRACTION) // MIB
    return CPU_BUDGET_MB
