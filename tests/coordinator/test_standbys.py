"""Warm standbys: the planner asks spares and neighbours with memory to spare to hold another
stage's layers, `mohawk plan --explain` shows them, and a failover re-plans onto the holders of
layers they report loaded, leaving every other stage's range as it was."""

from __future__ import annotations

from mohawk_common.bus.pipelines import pipelines
from mohawk_coordinator.explain import render
from mohawk_coordinator.plan_inputs import build_plan, same_placement
from mohawk_proto.v1 import bus_pb2
from tests.coordinator.harness import SHAPE
from tests.coordinator.test_plan_inputs import heartbeat, ranges, settings
from tests.coordinator.test_replicas import publish


def held(plan: bus_pb2.Plan) -> list[tuple[str, int, int, str]]:
    return [(s.node_id, s.start, s.end, s.covers) for s in plan.standbys]


def beats_holding(plan: bus_pb2.Plan, names: str, **memory: int) -> dict[str, bus_pb2.Heartbeat]:
    """The nodes' heartbeats once each holds the standby `plan` asked of it."""
    beats = {n: heartbeat(n, **memory) for n in names}
    for standby in plan.standbys:
        beats[standby.node_id].standby_layer_start = standby.start
        beats[standby.node_id].standby_layer_end = standby.end
    return beats


def test_neighbours_with_memory_to_spare_hold_the_longest_loads_first() -> None:
    beats = [heartbeat(n) for n in "abc"]
    plan = build_plan(SHAPE, beats, settings(standbys=True))
    assert ranges(plan) == [("a", 0, 10), ("b", 10, 20), ("c", 20, 30)]
    # the first and last stages carry the embedding and head: b covers a (the earlier of the two),
    # so c has no free neighbour; the middle stage is c's, the neighbour its frames reach (its KV
    # is mirrored there), before a
    assert held(plan) == [("b", 0, 10, "a"), ("c", 10, 20, "b")]
    assert any("standby: none for c's layers [20, 30)" in r for r in plan.reasons)
    assert any(
        "standby: b holds a's layers [0, 10) warm (its neighbour, widening its stage, its KV mirrored there"
        in r
        for r in plan.reasons
    )
    assert not build_plan(SHAPE, beats, settings()).standbys  # off by default
    # no room beside its own stage (own 243 MiB + the neighbour's 135 MiB of 1792 - 1500 MiB)
    tight = [heartbeat(n, memory_mib=1800, kv_mib=1500) for n in "abc"]
    assert not build_plan(SHAPE, tight, settings(standbys=True)).standbys


def test_a_spare_is_chosen_before_a_neighbour() -> None:
    beats = [heartbeat(n) for n in "abc"]
    plan = build_plan(SHAPE, beats, settings(standbys=True, replicas=2, placement="pack"))
    assert [p.node_ids for p in pipelines(plan)] == [("a",), ("b",)] and list(plan.spares) == ["c"]
    assert held(plan) == [("c", 0, 30, "a")]  # one standby per node: b's pipeline has none


def test_a_dead_middle_stage_is_taken_over_by_the_neighbour_holding_it() -> None:
    on = settings(standbys=True)
    first = publish(build_plan(SHAPE, [heartbeat(n) for n in "abc"], on), 1)
    first.pipelines[0].active = True
    beats = beats_holding(first, "abc")
    del beats["b"]
    second = publish(build_plan(SHAPE, beats.values(), on, first), 2)
    assert ranges(second) == [("a", 0, 10), ("c", 10, 30)]  # a keeps its range, c widens by b's
    repaired = "repaired from standbys, nothing loaded: c took b's layers [10, 20) warm"
    assert any(repaired in r for r in second.reasons)
    assert pipelines(second)[0].epoch == 2 and not pipelines(second)[0].active
    # the next standbys: c holds [10, 30) now, the longer load, which only a can hold; c holds a's
    assert held(second) == [("a", 10, 30, "c"), ("c", 0, 10, "a")]
    # a holder that has not reported the range loaded is no standby: the layers are placed afresh
    beats = {n: heartbeat(n) for n in "ac"}
    fresh = publish(build_plan(SHAPE, beats.values(), on, first), 2)
    assert ranges(fresh) == [("a", 0, 15), ("c", 15, 30)]
    assert not any("repaired" in r for r in fresh.reasons)


def test_a_dead_first_stage_is_taken_over_by_its_neighbour_and_a_dead_replica_by_the_spare() -> None:
    on = settings(standbys=True)
    first = publish(build_plan(SHAPE, [heartbeat(n) for n in "abc"], on), 1)
    beats = beats_holding(first, "abc")
    del beats["a"]
    second = publish(build_plan(SHAPE, beats.values(), on, first), 2)
    assert ranges(second) == [("b", 0, 20), ("c", 20, 30)]
    # two replicas and a spare: the spare holding a's whole range takes its pipeline's slot
    pack = settings(standbys=True, replicas=2, placement="pack")
    first = publish(build_plan(SHAPE, [heartbeat(n) for n in "abc"], pack), 3)
    beats = beats_holding(first, "abc")
    del beats["a"]
    second = publish(build_plan(SHAPE, beats.values(), pack, first), 4)
    kept, repaired = sorted(pipelines(second), key=lambda p: p.id, reverse=True)
    assert (kept.id, kept.epoch, kept.node_ids) == (1, 3, ("b",))
    assert (repaired.id, repaired.epoch, repaired.node_ids) == (0, 4, ("c",))
    assert any("c took a's layers [0, 30) warm" in r for r in second.reasons)


def test_explain_shows_the_standbys_and_whether_they_are_loaded() -> None:
    on = settings(standbys=True)
    plan = publish(build_plan(SHAPE, [heartbeat(n) for n in "abc"], on), 1)
    beats = beats_holding(plan, "abc")
    beats["c"].standby_layer_end = 0  # c has not loaded b's layers yet
    text = render(plan, beats)
    assert "standbys (layers held warm; a failover takes them over unloaded, its KV mirrored" in text
    rows = [line.split() for line in text.splitlines() if line.startswith(("b ", "c "))]
    assert rows == [
        ["b", "[0,", "10)", "a", "0", "?", "mirrored", "yes"],
        ["c", "[10,", "20)", "b", "0", "?", "mirrored", "no"],
    ]
    # a holder before the stage it covers gets no KV: the layers are computed again on takeover
    plan.standbys[1].node_id = "a"
    moved = [line.split() for line in render(plan, beats).splitlines() if line.startswith("a ")]
    assert moved == [["a", "[10,", "20)", "b", "0", "?", "computed", "no"]]
    # a change of standbys alone is a change of plan (it is published)
    other = build_plan(SHAPE, [heartbeat(n) for n in "abc"], on)
    del other.standbys[1]
    assert not same_placement(plan, other)
