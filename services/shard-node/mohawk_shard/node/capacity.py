"""What a node offers the planner: memory, KV bytes per block, and a measured per-layer speed.

Speed is measured, not assumed: one decoder layer of the served model (the node's own weights and
dtype, on its own device) runs a batch-1 decode step a dozen times and the fastest run is reported:
the minimum is the estimator least disturbed by whatever else the host was doing meanwhile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil
import torch

from mohawk_common.model_store import ModelSource
from mohawk_shard.backends.batch import ForwardBatch
from mohawk_shard.backends.torch_backend import TorchBackend

_MEMORY_SHARE = 0.8
_RUNS = 12


@dataclass(frozen=True, slots=True)
class Capacity:
    device: str
    total_memory_bytes: int
    memory_limit_bytes: int
    kv_cache_bytes: int
    kv_block_bytes_per_layer: int
    seconds_per_layer: float

    def free_memory_bytes(self) -> int:
        if self.device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info(torch.device(self.device))
            return int(free)
        return int(psutil.virtual_memory().available)


def measure_capacity(
    source: ModelSource,
    *,
    device: str,
    dtype: str,
    block_size: int,
    memory_limit_mb: int | None,
    kv_cache_memory_mb: int | None,
) -> Capacity:
    num_layers = source.config.num_layers
    layer = 1 if num_layers > 2 else 0
    backend = TorchBackend(source, layer, layer + 1, device=device, dtype=dtype)
    resolved = str(backend.torch_device)
    if resolved.startswith("cuda"):
        _free, total = torch.cuda.mem_get_info(backend.torch_device)
    else:
        total = psutil.virtual_memory().total
    limit = memory_limit_mb << 20 if memory_limit_mb else int(total * _MEMORY_SHARE)
    kv_bytes = (kv_cache_memory_mb << 20) if kv_cache_memory_mb else min(1 << 30, limit // 4)
    return Capacity(
        device=resolved,
        total_memory_bytes=int(total),
        memory_limit_bytes=int(limit),
        kv_cache_bytes=int(kv_bytes),
        kv_block_bytes_per_layer=backend.kv_bytes_per_block(block_size),
        seconds_per_layer=_time_one_layer(backend, block_size),
    )


def _time_one_layer(backend: TorchBackend, block_size: int) -> float:
    backend.allocate_kv_cache(2, block_size)
    hidden_size = backend.config.hidden_size
    hidden = torch.zeros(1, hidden_size, dtype=backend.dtype, device=backend.torch_device)
    batch = ForwardBatch.build([([0], 0, [0], False)], block_size)
    timings = []
    with torch.inference_mode():
        for _ in range(_RUNS + 1):
            start = time.perf_counter()
            backend.forward(batch, hidden if not backend.has_embedding else None)
            if backend.torch_device.type == "cuda":
                torch.cuda.synchronize(backend.torch_device)
            timings.append(time.perf_counter() - start)
    return float(min(timings[1:]))
