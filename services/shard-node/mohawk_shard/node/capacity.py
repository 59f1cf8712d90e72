"""What a node offers the planner: memory, KV and weight bytes, and a measured per-layer speed.

Weight bytes are the node's own: one decoder layer as the measuring backend holds it (in the
format and dtype it loads), embedding and head from `model/footprint.py`.

Speed is measured, not assumed: one decoder layer of the served model (the node's own weights and
dtype, on its own device) runs batch-1 decode steps back to back, at least a dozen and for at least
`SPREAD_S`, and the fastest is reported: the minimum is the estimator least disturbed by whatever
else the host was doing meanwhile, and the time span keeps a burst of other work from disturbing
every run. Two nodes and a gateway that start together on one
two-core host disturbed a dozen back-to-back runs of the bundled model's layer 12-fold (4 ms
against 0.35: its two threads waited at every barrier for a core another process held), and the
planner split the model 28 layers to 2.
torch is imported only where the device is a CUDA one or the backend is torch's, so an MLX node
measures itself without loading it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psutil

from mohawk_common.kv_groups import group_of_layer, model_kv_groups, page_layers
from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.config import ModelConfig
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.backends import make_backend
from mohawk_shard.config import engine_choice
from mohawk_shard.engine.backend import Backend
from mohawk_shard.kv_budget import node_kv_budget_bytes
from mohawk_shard.model.footprint import compute_dtype, stage_weight_bytes, weights_format
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.load_progress import quiet

_MEMORY_SHARE = 0.8
_RUNS = 12  # at least
_MAX_RUNS = 10_000
SPREAD_S = 0.5  # the runs span at least this long, unless _MAX_RUNS come first


@dataclass(frozen=True, slots=True)
class Capacity:
    device: str
    total_memory_bytes: int
    memory_limit_bytes: int
    kv_cache_bytes: int
    kv_block_bytes_per_layer: int
    seconds_per_layer: float
    layer_weight_bytes: int
    embedding_weight_bytes: int
    head_weight_bytes: int
    weights_format: str
    # each decoder layer's KV group (`kv_groups.group_of_layer`); empty: one group, every layer
    layer_groups: tuple[int, ...] = ()

    def page_layers(self, start: int, end: int) -> int:
        """Layers of [start, end) one KV block id costs: all of them, but with sliding-window
        groups only the most that one group has among them (`kv_groups.page_layers`)."""
        if not self.layer_groups:
            return end - start
        return page_layers(self.layer_groups, start, end)

    def describe(self, heartbeat: bus_pb2.Heartbeat, config: ModelConfig) -> None:
        """Fill in the model's shape and this node's weight bytes: all the coordinator needs to plan."""
        heartbeat.model_id = config.model_id
        heartbeat.num_layers = config.num_layers
        heartbeat.hidden_size = config.hidden_size
        heartbeat.vocab_size = config.vocab_size
        heartbeat.num_kv_heads = config.num_kv_heads
        heartbeat.head_dim = config.head_dim
        heartbeat.max_position_embeddings = config.max_position_embeddings
        heartbeat.layer_weight_bytes = self.layer_weight_bytes
        heartbeat.embedding_weight_bytes = self.embedding_weight_bytes
        heartbeat.head_weight_bytes = self.head_weight_bytes
        heartbeat.weights_format = self.weights_format
        windows = [config.layer_window(i) or 0 for i in range(config.num_layers)]
        if any(windows):
            heartbeat.layer_windows.extend(windows)

    def free_memory_bytes(self) -> int:
        if self.device.startswith("cuda"):
            free, _ = _cuda_memory(self.device)
            return free
        return int(psutil.virtual_memory().available)


def measure_capacity(
    source: ModelSource,
    *,
    backend: str = "torch",
    device: str,
    dtype: str,
    weights: str | None = None,
    kv_cache_dtype: str | None = None,
    block_size: int,
    memory_limit_mb: int | None,
    kv_cache_memory_mb: int | None,
    held: tuple[int, int] | None = None,
    alone: Callable[[Callable[[], float]], float] | None = None,
) -> Capacity:
    """`held`: the only layers the node has (a slice package); the measured layer is one of them.
    `alone`: runs the timing with the host's cores to this node (`HostCores.undisturbed`), where
    nodes share them."""
    weights = engine_choice("weights", weights)
    kv_cache_dtype = engine_choice("kv_cache_dtype", kv_cache_dtype)
    config = source.config
    layer = held[0] if held is not None else (1 if config.num_layers > 2 else 0)
    if held is None and config.num_experts and not config.is_moe_layer(layer):
        # a MoE model's dense layers (Qwen3-MoE `mlp_only_layers`) are smaller: plan by a MoE one
        layer = next((i for i in range(config.num_layers) if config.is_moe_layer(i)), layer)
    with quiet():  # not a stage the node serves: nothing for `mohawk up` to show
        stage = make_backend(
            backend,
            source,
            layer,
            layer + 1,
            device=device,
            dtype=dtype,
            weights=weights,
            kv_cache_dtype=kv_cache_dtype,
        )
    resolved = stage.device
    if resolved.startswith("cuda"):
        _free, total = _cuda_memory(resolved)
    else:
        total = psutil.virtual_memory().total
    limit = memory_limit_mb << 20 if memory_limit_mb else int(total * _MEMORY_SHARE)
    kv_bytes = node_kv_budget_bytes(kv_cache_memory_mb, limit, resolved)
    held_dtype = compute_dtype(dtype, resolved, weights)
    ends = stage_weight_bytes(source, weights, held_dtype, resolved)
    # the measured layer comes alone, except in a model of one or two layers, where it is layer 0
    ends_held = ends.held(embedding=stage.has_embedding, head=stage.has_head)

    def timing() -> float:
        return _time_one_layer(stage, block_size, config.hidden_size)

    return Capacity(
        device=resolved,
        total_memory_bytes=int(total),
        memory_limit_bytes=int(limit),
        kv_cache_bytes=int(kv_bytes),
        kv_block_bytes_per_layer=stage.kv_bytes_per_block(block_size),
        seconds_per_layer=alone(timing) if alone is not None else timing(),
        layer_weight_bytes=max(1, stage.weight_bytes - ends_held),
        embedding_weight_bytes=ends.embedding,
        head_weight_bytes=ends.head,
        weights_format=weights_format(source, weights, held_dtype),
        layer_groups=tuple(group_of_layer(model_kv_groups(source.config), source.config.num_layers)),
    )


def _time_one_layer(backend: Backend, block_size: int, hidden_size: int) -> float:
    """Fastest of the batch-1 decode steps of one layer (module docstring; the backend's forward
    returns only when its result is computed: torch synchronises below on CUDA, MLX evaluates in
    forward). The first step, which warms caches and builds what is built once, is not counted."""
    backend.allocate_kv_cache(2, block_size)
    hidden = backend.decode_hidden("float32", [1, hidden_size], bytes(4 * hidden_size))
    batch = ForwardBatch.build([([0], 0, [0], False)], block_size)
    timings: list[float] = []
    with _no_grad(backend):
        began = time.monotonic()
        while len(timings) <= _RUNS or (time.monotonic() - began < SPREAD_S and len(timings) <= _MAX_RUNS):
            start = time.perf_counter()
            backend.forward(batch, hidden if not backend.has_embedding else None)
            if backend.device.startswith("cuda"):
                _cuda_synchronize(backend.device)
            timings.append(time.perf_counter() - start)
    return float(min(timings[1:]))


def _no_grad(backend: Backend) -> AbstractContextManager[Any]:
    if backend.name != "torch":
        return contextlib.nullcontext()
    import torch

    return torch.inference_mode()


def _cuda_memory(device: str) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device."""
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(device))
    return int(free), int(total)


def _cuda_synchronize(device: str) -> None:
    import torch

    torch.cuda.synchronize(torch.device(device))
