"""Placement planner: memory limits, measured speed, fewer hops, determinism, explanations."""

from __future__ import annotations

import random

import pytest

from mohawk_coordinator.planner import ModelFootprint, NodeCapacity, PlanningError, plan_placement

MIB = 2**20
# SmolLM2-135M-like: 30 layers of 13.5 MiB, a 108 MiB embedding tied to the head
MODEL = ModelFootprint(
    "smollm2", num_layers=30, layer_bytes=int(13.5 * MIB), embedding_bytes=108 * MIB, head_bytes=108 * MIB
)


def node(node_id: str, mib: float, ms_per_layer: float = 1.0) -> NodeCapacity:
    return NodeCapacity(node_id, int(mib * MIB), ms_per_layer / 1000)


def ranges(plan: object) -> list[tuple[str, int, int]]:
    return [(s.node_id, s.start, s.end) for s in plan.stages]  # type: ignore[attr-defined]


def test_one_node_that_holds_everything_gets_everything() -> None:
    plan = plan_placement(MODEL, [node("b", 4096, 2.0), node("a", 4096, 1.0), node("c", 100, 0.1)])
    assert ranges(plan) == [("a", 0, 30)]
    assert "holds the whole model" in plan.explain()


def test_equal_nodes_split_evenly_within_memory() -> None:
    plan = plan_placement(MODEL, [node(n, 260) for n in "abc"])
    assert ranges(plan) == [("a", 0, 10), ("b", 10, 20), ("c", 20, 30)]
    assert all(s.memory_bytes <= 260 * MIB for s in plan.stages)


def test_faster_node_takes_more_layers() -> None:
    plan = plan_placement(MODEL, [node("fast", 400, 1.0), node("slow", 400, 3.0)])
    by_node = {s.node_id: s.num_layers for s in plan.stages}
    assert by_node["fast"] > by_node["slow"]
    assert plan.bottleneck_seconds == pytest.approx(max(by_node["fast"] * 1.0, by_node["slow"] * 3.0) / 1000)


def test_memory_limit_overrides_speed() -> None:
    # the fast node can hold only its embedding and 4 layers
    plan = plan_placement(MODEL, [node("a-fast", 108 + 4 * 13.5 + 1, 0.1), node("b-slow", 600, 5.0)])
    assert ranges(plan) == [("a-fast", 0, 4), ("b-slow", 4, 30)]


def test_fewer_hops_when_bottleneck_ties() -> None:
    # d adds nothing: a, b and c already give the minimal bottleneck of 10 layers each
    plan = plan_placement(MODEL, [node("a", 260), node("b", 260), node("c", 260), node("d", 50)])
    assert len(plan.stages) == 3


def test_deterministic_whatever_the_heartbeat_order() -> None:
    nodes = [node(f"n{i}", 150 + 20 * i, 1.0 + (i % 3)) for i in range(6)]
    first = plan_placement(MODEL, nodes)
    for seed in range(5):
        shuffled = list(nodes)
        random.Random(seed).shuffle(shuffled)
        assert plan_placement(MODEL, shuffled) == first
    assert [s.end for s in first.stages][-1] == 30
    assert all(a.end == b.start for a, b in zip(first.stages, first.stages[1:], strict=False))


def test_impossible_placement_is_a_clear_error() -> None:
    with pytest.raises(PlanningError, match="cannot hold it"):
        plan_placement(MODEL, [node("a", 100), node("b", 100)])
    with pytest.raises(PlanningError, match="no nodes"):
        plan_placement(MODEL, [])


def test_spread_gives_every_node_a_share_even_when_one_could_hold_all() -> None:
    nodes = [node("a", 4096), node("b", 4096), node("c", 4096)]
    assert ranges(plan_placement(MODEL, nodes)) == [("a", 0, 30)]  # pack is the default
    plan = plan_placement(MODEL, nodes, "spread")
    assert ranges(plan) == [("a", 0, 10), ("b", 10, 20), ("c", 20, 30)]
    assert "spread" in plan.explain()


def test_spread_minimises_the_slowest_stage() -> None:
    plan = plan_placement(MODEL, [node("a", 4096, 1.0), node("b", 4096, 2.0)], "spread")
    assert ranges(plan) == [("a", 0, 20), ("b", 20, 30)]


def test_spread_leaves_out_nodes_that_cannot_hold_one_layer() -> None:
    plan = plan_placement(MODEL, [node("a", 4096), node("b", 10), node("c", 4096)], "spread")
    assert ranges(plan) == [("a", 0, 15), ("c", 15, 30)]
    assert any("left out" in reason and "b" in reason for reason in plan.reasons)


def test_spread_with_more_nodes_than_layers_packs() -> None:
    tiny = ModelFootprint("tiny", num_layers=2, layer_bytes=MIB, embedding_bytes=MIB, head_bytes=MIB)
    plan = plan_placement(tiny, [node(n, 100) for n in "abc"], "spread")
    assert len(plan.stages) == 1 and "fewest hops" in plan.reasons[0]


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(PlanningError, match="unknown placement policy"):
        plan_placement(MODEL, [node("a", 4096)], "round-robin")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["pack", "spread"])
def test_nodes_holding_a_slice_get_only_layers_inside_it(policy: str) -> None:
    # ids sort against the layer order, and the big node could hold everything but holds [0, 10)
    nodes = [
        NodeCapacity("a-tail", 4096 * MIB, 0.001, held=(10, MODEL.num_layers)),
        NodeCapacity("z-head", 4096 * MIB, 0.001, held=(0, 10)),
    ]
    plan = plan_placement(MODEL, nodes, policy)  # type: ignore[arg-type]
    assert [(s.node_id, s.start, s.end) for s in plan.stages] == [
        ("z-head", 0, 10),
        ("a-tail", 10, MODEL.num_layers),
    ]


def test_slices_that_leave_a_gap_cannot_be_planned() -> None:
    nodes = [
        NodeCapacity("a", 4096 * MIB, 0.001, held=(0, 5)),
        NodeCapacity("b", 4096 * MIB, 0.001, held=(6, 30)),
    ]
    with pytest.raises(PlanningError):
        plan_placement(MODEL, nodes, "spread")
