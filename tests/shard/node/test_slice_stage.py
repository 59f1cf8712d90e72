"""A node serving from a slice package refuses, counted and before it stops or loads anything, a
plan stage its verified manifest does not hold."""

from __future__ import annotations

import asyncio

import pytest

from mohawk_common.bus.security import Security
from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import ModelSource, open_model
from mohawk_common.model_store.slice_source import SliceSource
from mohawk_pqc.kem import CryptographyKem
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.config import NodeSettings
from mohawk_shard.node.service import ShardNode


@pytest.fixture(scope="module")
def bundled() -> ModelSource:
    return open_model(None)


def plan(*ranges: tuple[int, int]) -> bus_pb2.Plan:
    stages = [bus_pb2.PlanStage(node_id=f"n{i}", start=a, end=b) for i, (a, b) in enumerate(ranges)]
    return bus_pb2.Plan(version=3, model="m", num_layers=30, stages=stages, num_kv_blocks=8, block_size=16)


def node_holding(bundled: ModelSource, start: int, end: int) -> ShardNode:
    node = ShardNode(
        NodeSettings.model_validate({"node_id": "n1", "insecure": True}),
        Security(None, CryptographyKem(), role="shard"),
    )
    manifest = {"layer_start": start, "layer_end": end, "embedding": start == 0, "head": end == 30}
    node.source = SliceSource(manifest, bundled.config, bundled.hf_config, {})
    return node


def test_a_stage_outside_the_slice_is_refused_and_counted(bundled: ModelSource) -> None:
    node = node_holding(bundled, 10, 20)
    with pytest.raises(ModelLoadError, match=r"layers \[5, 20\), which its slice package does not hold"):
        asyncio.run(node.stages.follow(plan((0, 5), (5, 20), (20, 30))))
    assert node.security.rejections == {"bad_version": 1}
    assert node.stages.plan is None and node.role is None  # nothing followed, nothing loaded


def test_a_stage_inside_the_slice_passes_the_check(bundled: ModelSource) -> None:
    node = node_holding(bundled, 10, 20)
    node.stages.check_slice_holds(bus_pb2.PlanStage(node_id="n1", start=12, end=20))
    assert not node.security.rejections
