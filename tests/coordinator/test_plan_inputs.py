"""From heartbeats to a Plan: footprint, capacities, KV blocks, context length, determinism."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mohawk_coordinator.config import CoordinatorSettings
from mohawk_coordinator.plan_inputs import (
    ModelShape,
    ShapeMismatchError,
    activate_ready,
    build_plan,
    node_capacities,
    quantize_seconds,
    same_placement,
)
from mohawk_coordinator.planner import PlanningError
from mohawk_proto.v1 import bus_pb2
from tests.coordinator.fake_node import describe_model
from tests.coordinator.harness import SHAPE
from tests.coordinator.harness import settings as harness_settings

MIB = 2**20
BLOCK_BYTES = 16 * 1536  # one block of one layer, fp32 KV of 3 heads × 64


def settings(**overrides: Any) -> CoordinatorSettings:
    return harness_settings("", "c", **overrides)


def heartbeat(
    node_id: str, seconds: float = 1e-3, memory_mib: int = 2048, kv_mib: int = 256
) -> bus_pb2.Heartbeat:
    return bus_pb2.Heartbeat(
        node_id=node_id,
        model="smollm2-135m-instruct",
        backend="torch",
        device="cpu",
        memory_limit_bytes=memory_mib * MIB,
        kv_cache_bytes=kv_mib * MIB,
        seconds_per_layer=seconds,
        kv_block_bytes_per_layer=BLOCK_BYTES,
    )


def ranges(plan: bus_pb2.Plan) -> list[tuple[str, int, int]]:
    return [(s.node_id, s.start, s.end) for s in plan.stages]


def test_shape_comes_from_the_heartbeats_with_the_largest_bytes_reported() -> None:
    beats = [describe_model(heartbeat("a"), layer_mib=6.75), describe_model(heartbeat("b")), heartbeat("c")]
    shape = ModelShape.from_heartbeats(beats)  # c reports no shape (yet): it does not count
    assert shape == SHAPE
    assert ModelShape.from_heartbeats([heartbeat("a")]) is None


def test_nodes_that_disagree_on_the_shape_are_not_planned() -> None:
    other = describe_model(heartbeat("b"))
    other.num_layers = 24
    with pytest.raises(ShapeMismatchError, match="same model"):
        ModelShape.from_heartbeats([describe_model(heartbeat("a")), other])


def test_speeds_round_to_two_digits_and_unmeasured_nodes_count_as_the_slowest() -> None:
    assert quantize_seconds(0.0012345) == 0.0012
    assert quantize_seconds(0.0) == 0.0
    capacities = node_capacities([heartbeat("a", 0.00123), heartbeat("b", 0.0031), heartbeat("c", 0.0)])
    assert [c.seconds_per_layer for c in capacities] == [0.0012, 0.0031, 0.0031]
    assert capacities[0].memory_bytes == (2048 - 256) * MIB  # weights go where the KV pool is not


def test_speed_noise_does_not_change_the_plan() -> None:
    calm = build_plan(SHAPE, [heartbeat("a", 0.00120), heartbeat("b", 0.00240)], settings())
    noisy = build_plan(SHAPE, [heartbeat("a", 0.001204), heartbeat("b", 0.002396)], settings())
    assert same_placement(calm, noisy)
    assert ranges(calm) == [("a", 0, 20), ("b", 20, 30)]  # the twice-as-fast node takes twice the layers


def test_same_nodes_in_any_heartbeat_order_give_the_same_plan() -> None:
    beats = [heartbeat(f"n{i}", 1e-3 * (1 + i % 3), 700 + 100 * i) for i in range(5)]
    first = build_plan(SHAPE, beats, settings())
    for seed in range(5):
        shuffled = list(beats)
        random.Random(seed).shuffle(shuffled)
        assert build_plan(SHAPE, shuffled, settings()) == first


def test_kv_blocks_are_set_by_the_tightest_stage() -> None:
    plan = build_plan(SHAPE, [heartbeat("a", kv_mib=64), heartbeat("b", kv_mib=512)], settings())
    assert ranges(plan) == [("a", 0, 15), ("b", 15, 30)]
    assert plan.num_kv_blocks == (64 * MIB) // (15 * BLOCK_BYTES)
    assert plan.max_model_len == min(8192, plan.num_kv_blocks * 16)
    assert any("set by a" in reason for reason in plan.reasons)


def test_max_model_len_is_the_least_of_model_setting_and_kv() -> None:
    nodes = [heartbeat("a"), heartbeat("b")]
    assert build_plan(SHAPE, nodes, settings()).max_model_len == 8192
    assert build_plan(SHAPE, nodes, settings(max_model_len=2048)).max_model_len == 2048
    small = build_plan(SHAPE, [heartbeat("a", kv_mib=4), heartbeat("b", kv_mib=4)], settings())
    assert small.max_model_len == small.num_kv_blocks * 16 < 8192


def test_a_stage_without_room_for_one_kv_block_is_refused() -> None:
    with pytest.raises(PlanningError, match="no room for one KV block"):
        build_plan(SHAPE, [heartbeat("a", kv_mib=0), heartbeat("b")], settings())


def test_nodes_that_do_not_report_block_bytes_are_assumed_fp32() -> None:
    beats = [heartbeat("a"), heartbeat("b")]
    beats[0].kv_block_bytes_per_layer = 0
    plan = build_plan(SHAPE, beats, settings(block_size=32))
    assert plan.num_kv_blocks == (256 * MIB) // (15 * 32 * SHAPE.kv_bytes_per_token_per_layer)


def test_pack_puts_a_model_that_fits_on_one_node() -> None:
    plan = build_plan(SHAPE, [heartbeat("a", 2e-3), heartbeat("b", 1e-3)], settings(placement="pack"))
    assert ranges(plan) == [("b", 0, 30)]


def test_a_pipeline_activates_once_every_stage_node_loaded_this_version() -> None:
    plan = build_plan(SHAPE, [heartbeat("a"), heartbeat("b")], settings())
    plan.version = 4
    live = {"a": heartbeat("a"), "b": heartbeat("b")}
    live["a"].plan_version, live["a"].loaded = 4, True
    assert activate_ready(plan, live) is None
    live["b"].plan_version, live["b"].loaded = 3, True
    assert activate_ready(plan, live) is None
    live["b"].plan_version = 4
    active = activate_ready(plan, live)
    assert active is not None and active.state == "active" and active.pipelines[0].active
    assert activate_ready(active, live) is None  # nothing left to activate
    del live["b"]
    assert activate_ready(plan, live) is None
