"""Planning a model with sliding-window layers: a block id costs a stage only one KV group's layers,
and context is what one sequence's blocks, a sliding group holding its window, fit."""

from __future__ import annotations

from dataclasses import replace

from mohawk_common.kv_groups import kv_groups
from mohawk_coordinator.plan_inputs import ModelShape, build_plan
from tests.coordinator.fake_node import describe_model
from tests.coordinator.harness import SHAPE
from tests.coordinator.test_plan_inputs import BLOCK_BYTES, MIB, heartbeat, ranges, settings

ALTERNATING = [64 if i % 2 == 0 else None for i in range(30)]  # Gemma-2-style, window 64


def test_alternating_layers_hold_twice_the_block_ids() -> None:
    beats = [describe_model(heartbeat("a", kv_mib=64)), describe_model(heartbeat("b", kv_mib=512))]
    for beat in beats:
        beat.layer_windows.extend(w or 0 for w in ALTERNATING)
    shape = ModelShape.from_heartbeats(beats)
    assert shape is not None and shape.kv_groups == kv_groups(ALTERNATING)
    plan = build_plan(shape, beats, settings())
    assert ranges(plan) == [("a", 0, 15), ("b", 15, 30)]
    assert plan.num_kv_blocks == (64 * MIB) // (8 * BLOCK_BYTES)  # 15 layers: 8 of one group
    # a sequence of L tokens takes L/16 full-group ids and at most 5 sliding ones
    assert plan.max_model_len == min(8192, (plan.num_kv_blocks - 5) * 16)


def test_an_all_sliding_model_is_not_bounded_by_its_blocks() -> None:
    shape = replace(SHAPE, kv_groups=kv_groups([64] * 30))
    plan = build_plan(shape, [heartbeat("a", kv_mib=4), heartbeat("b", kv_mib=4)], settings())
    assert plan.num_kv_blocks * 16 < 8192 and plan.max_model_len == 8192
