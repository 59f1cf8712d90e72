"""Replicas: several pipelines from the live nodes, spares, and pipelines kept through replans."""

from __future__ import annotations

from mohawk_common.bus.pipelines import node_view, pipelines, same_assignment
from mohawk_coordinator.plan_inputs import activate_ready, build_plan, same_placement
from mohawk_coordinator.planner import NodeCapacity
from mohawk_coordinator.replicas import _deal
from mohawk_proto.v1 import bus_pb2
from tests.coordinator.harness import SHAPE
from tests.coordinator.test_plan_inputs import heartbeat, settings


def lines(plan: bus_pb2.Plan) -> dict[int, list[str]]:
    return {p.id: list(p.node_ids) for p in pipelines(plan)}


def publish(plan: bus_pb2.Plan, version: int) -> bus_pb2.Plan:
    """What the coordinator does to a fresh plan before writing it."""
    plan.version = version
    for pipeline in plan.pipelines:
        pipeline.epoch = pipeline.epoch or version
    return plan


def test_two_replicas_of_four_nodes_are_two_pipelines_of_two() -> None:
    beats = [heartbeat(n, s) for n, s in [("a", 1e-3), ("b", 1e-3), ("c", 2e-3), ("d", 2e-3)]]
    plan = build_plan(SHAPE, beats, settings(replicas=2))
    # snake order: a, b, c, d by speed -> groups [a, d] and [b, c]
    assert lines(plan) == {0: ["a", "d"], 1: ["b", "c"]}
    assert not plan.spares and plan.state == "loading"
    assert all(s.end - s.start for s in plan.stages)
    assert [(s.start, s.end) for s in pipelines(plan)[0].stages][-1][1] == SHAPE.footprint.num_layers
    assert plan.reasons[0].startswith("replicas 2: 2 pipeline(s); 2 serving")
    assert any(r.startswith("pipeline 1: ") for r in plan.reasons)


def test_auto_forms_as_many_pipelines_as_the_nodes_hold() -> None:
    beats = [heartbeat(n) for n in "abc"]
    plan = build_plan(SHAPE, beats, settings(replicas="auto"))
    assert lines(plan) == {0: ["a"], 1: ["b"], 2: ["c"]}
    tiny = [heartbeat(n, memory_mib=600, kv_mib=256) for n in "abcd"]  # one holds about half the model
    plan = build_plan(SHAPE, tiny, settings(replicas="auto"))
    assert sorted(len(ids) for ids in lines(plan).values()) == [2, 2]


def test_nodes_beyond_what_the_replicas_need_are_spares() -> None:
    beats = [heartbeat(n) for n in "abc"]
    plan = build_plan(SHAPE, beats, settings(replicas=2, placement="pack"))
    assert lines(plan) == {0: ["a"], 1: ["b"]} and list(plan.spares) == ["c"]
    assert "1 spare node(s)" in plan.reasons[0]


def test_a_failed_stage_is_replaced_by_a_spare_and_the_other_pipeline_is_kept() -> None:
    beats = {n: heartbeat(n) for n in "abcde"}
    pack = settings(replicas=2, placement="pack")
    first = publish(build_plan(SHAPE, beats.values(), pack), 3)
    assert lines(first) == {0: ["a"], 1: ["b"]} and list(first.spares) == ["c", "d", "e"]
    first.pipelines[0].active = first.pipelines[1].active = True
    del beats["b"]  # pipeline 1's node dies
    second = publish(build_plan(SHAPE, beats.values(), pack, first), 4)
    kept, formed = pipelines(second)
    assert (kept.id, kept.epoch, kept.active, kept.node_ids) == (0, 3, True, ("a",))
    assert (formed.id, formed.epoch, formed.active, formed.node_ids) == (1, 4, False, ("c",))
    assert list(second.spares) == ["d", "e"]
    assert second.state == "active"  # pipeline 0 serves on while pipeline 1 loads
    # the kept pipeline's node sees the very same assignment, so it keeps serving
    before, after = node_view(first, "a"), node_view(second, "a")
    assert before is not None and after is not None and same_assignment(before[0], after[0])
    # a spread pipeline that loses a stage is formed again from its survivor and a spare
    beats = {n: heartbeat(n) for n in "abcde"}
    spread = settings(replicas=2)
    first = publish(build_plan(SHAPE, [beats[n] for n in "abcd"], spread), 5)
    assert lines(first) == {0: ["a", "d"], 1: ["b", "c"]}
    del beats["c"]
    second = publish(build_plan(SHAPE, beats.values(), spread, first), 6)
    assert lines(second)[0] == ["a", "d"] and sorted(lines(second)[1]) == ["b", "e"]
    b_before, b_after = node_view(first, "b"), node_view(second, "b")
    assert b_before is not None and b_after is not None and not same_assignment(b_before[0], b_after[0])


def test_a_joining_node_waits_as_a_spare_when_the_replicas_are_whole() -> None:
    beats = {n: heartbeat(n) for n in "ab"}
    first = publish(build_plan(SHAPE, beats.values(), settings(replicas=2, placement="pack")), 1)
    beats["c"] = heartbeat("c")
    second = build_plan(SHAPE, beats.values(), settings(replicas=2, placement="pack"), first)
    assert lines(second) == lines(first) and list(second.spares) == ["c"]
    assert not same_placement(first, second)  # published, so explain shows the spare
    assert same_placement(
        second, build_plan(SHAPE, beats.values(), settings(replicas=2, placement="pack"), second)
    )


def test_one_replica_replans_every_live_node_afresh() -> None:
    beats = {n: heartbeat(n) for n in "ab"}
    first = publish(build_plan(SHAPE, beats.values(), settings()), 1)
    beats["c"] = heartbeat("c")
    second = build_plan(SHAPE, beats.values(), settings(), first)
    assert lines(second) == {0: ["a", "b", "c"]} and not second.spares


def test_each_pipeline_activates_by_itself() -> None:
    beats = {n: heartbeat(n) for n in "ab"}
    plan = publish(build_plan(SHAPE, beats.values(), settings(replicas=2, placement="pack")), 2)
    beats["a"].plan_version, beats["a"].loaded = 2, True
    active = activate_ready(plan, beats)
    assert active is not None and active.state == "active"
    assert [p.active for p in active.pipelines] == [True, False]


def test_a_plan_without_pipelines_reads_as_one() -> None:
    plan = bus_pb2.Plan(version=7, state="active", num_kv_blocks=9, max_model_len=144)
    plan.stages.add(node_id="a", start=0, end=10)
    plan.stages.add(node_id="b", start=10, end=30)
    (only,) = pipelines(plan)
    assert (only.id, only.epoch, only.active, only.num_kv_blocks, only.node_ids) == (
        0,
        7,
        True,
        9,
        ("a", "b"),
    )
    found = node_view(plan, "b")
    assert found is not None and found[1] == 1 and found[0].version == 7 and len(found[0].stages) == 2
    assert node_view(plan, "z") is None


def test_dealing_mixes_fast_and_slow_nodes() -> None:
    nodes = [NodeCapacity(n, 1, i) for i, n in enumerate("abcdef")]
    assert [[n.node_id for n in g] for g in _deal(nodes, 2)] == [["a", "d", "e"], ["b", "c", "f"]]
