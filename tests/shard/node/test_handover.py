"""Make before break (`node/handover.py`): what a next stage costs, when it fits beside the running
one, and a stage of the same layer range sharing the weights but not the KV pool."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mohawk_common.model_store import ModelSource, open_model
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.backends import make_backend
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.node import handover
from mohawk_shard.node.capacity import Capacity, measure_capacity
from mohawk_shard.node.handover import (
    StageFootprint,
    room_for_both,
    serving_footprint,
    share_weights,
    stage_footprint,
)
from mohawk_shard.node.pipeline_view import PipelineView
from tests.shard.engine.test_more_architectures import build_tiny

MIB = 1 << 20
CAPACITY = Capacity(
    device="cpu",
    total_memory_bytes=16_000 * MIB,
    memory_limit_bytes=1_000 * MIB,
    kv_cache_bytes=256 * MIB,
    kv_block_bytes_per_layer=1 * MIB,
    seconds_per_layer=1e-3,
    layer_weight_bytes=10 * MIB,
    embedding_weight_bytes=50 * MIB,
    head_weight_bytes=40 * MIB,
    weights_format="q4_1",
)


def view(*ranges: tuple[int, int], num_kv_blocks: int = 8) -> PipelineView:
    stages = [bus_pb2.PlanStage(node_id=f"n{i}", start=a, end=b) for i, (a, b) in enumerate(ranges)]
    return PipelineView(
        bus_pb2.Plan(version=7, num_layers=ranges[-1][1], stages=stages, num_kv_blocks=num_kv_blocks)
    )


def test_a_stage_costs_its_layers_its_ends_and_its_kv_pool() -> None:
    plan = view((0, 10), (10, 20), (20, 30))
    assert stage_footprint(CAPACITY, plan, 0) == StageFootprint((100 + 50) * MIB, 8 * 10 * MIB)
    assert stage_footprint(CAPACITY, plan, 1) == StageFootprint(100 * MIB, 80 * MIB)
    assert stage_footprint(CAPACITY, plan, 2) == StageFootprint((100 + 40) * MIB, 80 * MIB)
    # the same layer range as the stage it serves: only a second KV pool
    assert stage_footprint(CAPACITY, plan, 1, shared_weights=True) == StageFootprint(0, 80 * MIB)


def test_room_for_both_needs_the_memory_limit_and_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    free = {"bytes": 8_000 * MIB}
    monkeypatch.setattr(Capacity, "free_memory_bytes", lambda self: free["bytes"])
    serving = StageFootprint(400 * MIB, 200 * MIB)
    assert room_for_both(CAPACITY, serving, StageFootprint(300 * MIB, 100 * MIB))  # 1,000 of 1,000
    assert not room_for_both(CAPACITY, serving, StageFootprint(300 * MIB, 101 * MIB))
    free["bytes"] = 300 * MIB  # the host has less free than the limit promises
    assert not room_for_both(CAPACITY, serving, StageFootprint(200 * MIB, 100 * MIB))
    assert room_for_both(CAPACITY, serving, StageFootprint(200 * MIB, 50 * MIB))
    assert handover.FREE_MEMORY_SHARE < 1


@pytest.fixture(scope="module")
def bundled() -> ModelSource:
    return open_model(None)


def run_one(backend: TorchBackend, tokens: list[int], block_size: int) -> torch.Tensor:
    batch = ForwardBatch.build([(tokens, 0, [0, 1], True)], block_size)
    result: torch.Tensor = backend.forward(batch, None)
    return result


def test_a_stage_of_the_same_range_shares_weights_and_keeps_its_own_kv(bundled: ModelSource) -> None:
    block_size = 8
    serving = make_backend("torch", bundled, 0, 2, device="cpu", dtype="float32")
    assert isinstance(serving, TorchBackend)
    serving.allocate_kv_cache(4, block_size)
    run_one(serving, [1, 2, 3, 4, 5], block_size)
    before = [cache.key.clone() for cache in serving.kv_caches]

    upcoming = share_weights(serving)
    assert isinstance(upcoming, TorchBackend)
    upcoming.allocate_kv_cache(4, block_size)
    assert upcoming.model is serving.model  # the weights are held once
    assert all(a.key is not b.key for a, b in zip(upcoming.kv_caches, serving.kv_caches, strict=True))
    out = run_one(upcoming, [9, 8, 7], block_size)
    assert all(torch.equal(cache.key, old) for cache, old in zip(serving.kv_caches, before, strict=True))
    # the shared stage computes what a freshly loaded one does
    fresh = make_backend("torch", bundled, 0, 2, device="cpu", dtype="float32")
    assert isinstance(fresh, TorchBackend)
    fresh.allocate_kv_cache(4, block_size)
    np.testing.assert_array_equal(out.numpy(), run_one(fresh, [9, 8, 7], block_size).numpy())
    footprint = serving_footprint(
        replace(CAPACITY, kv_block_bytes_per_layer=MIB), serving, view((0, 2), (2, 30))
    )
    assert footprint == StageFootprint(serving.weight_bytes, 8 * 2 * MIB)


def test_with_sliding_window_groups_a_block_costs_one_groups_layers() -> None:
    # Gemma 2's alternation: even layers slide, odd ones attend to all; a block id holds one group's
    alternating = replace(CAPACITY, layer_groups=tuple(i % 2 for i in range(30)))
    plan = view((0, 10), (10, 20), (20, 30))
    assert stage_footprint(alternating, plan, 1) == StageFootprint(100 * MIB, 8 * 5 * MIB)
    assert stage_footprint(alternating, view((0, 3), (3, 30)), 0).kv_bytes == 8 * 2 * MIB


def test_a_windowed_models_footprint_is_what_its_stage_allocates(
    bundled: ModelSource, tmp_path: Path
) -> None:
    directory = tmp_path / "gemma2"
    build_tiny("gemma2-softcap-window", directory, bundled.load_tokenizer())
    source = open_model(directory)
    block_size, num_blocks = 4, 6
    capacity = measure_capacity(
        source,
        device="cpu",
        dtype="float32",
        block_size=block_size,
        memory_limit_mb=None,
        kv_cache_memory_mb=16,
    )
    assert len(set(capacity.layer_groups)) == 2
    layers = source.config.num_layers
    stage = make_backend("torch", source, 0, layers, device="cpu", dtype="float32")
    assert isinstance(stage, TorchBackend)
    stage.allocate_kv_cache(num_blocks, block_size)
    # layers of different groups share a page's tensors: count each tensor once
    tensors = {t.data_ptr(): t.nbytes for c in stage.kv_caches for t in (c.key, c.value)}
    allocated = sum(tensors.values())
    footprint = serving_footprint(capacity, stage, view((0, layers), num_kv_blocks=num_blocks))
    assert footprint.kv_bytes == allocated
    assert capacity.page_layers(0, layers) < layers  # less than every layer's KV per block id
