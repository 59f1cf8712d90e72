"""Warm standbys: which node holds which stage's layers loaded ahead of a failure, and the failover
that re-plans onto them.

Design. Part of a failover's stall is the replacement loading its layers (a third of a 1.7B-shaped
Q4_K_M file took 0.87-0.97 s in `tests/chaos/test_real_size_failover.py`; a bigger model, or a
slower disk, takes longer). With `standbys` on, the plan asks nodes with memory to spare to hold another
stage's layer range warm: weights loaded, no KV pool. Two kinds of holder can take a stage over
without loading: a spare (a live node in no pipeline) takes the dead node's stage as it was, and a
neighbour in the same pipeline (the stage just before or after) widens its own stage by the range,
running both as one stage (`StackedBackend`). Stages are covered in order of their weight bytes,
the longest load first, each by the candidate that costs least: a spare before a neighbour (the
pipeline keeps its speed), the neighbour after the stage before the one before it (the stage's
frames reach it, so the stage mirrors its KV there, `kv_mirror`, and taking the range over
computes nothing again), then the one whose stage would be fastest after taking the range over;
a node holds one standby at most, and it must fit the node's weight memory beside what it serves.
When a plan's stage loses its node, `repair` re-forms that pipeline from the current plan with
the standby's holder in the dead node's place (or widened over it), but only where the holder is
live as the run it was asked of and reports the range loaded; a pipeline with a dead stage that
no such standby covers is placed afresh, as without standbys. The other stages keep their ranges,
so no node of a repaired pipeline loads a layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mohawk_common.bus.pipelines import Pipeline, pipelines
from mohawk_coordinator.planner import ModelFootprint, NodeCapacity, Plan, stage_placement
from mohawk_coordinator.replicas import plans_model, runs_on
from mohawk_proto.v1 import bus_pb2


@dataclass(frozen=True, slots=True)
class _Candidate:
    node: NodeCapacity
    spare: bool
    seconds_after: float  # the holder's stage per token once it has taken the range over
    upstream: bool = False  # a neighbour before the stage, which its frames never reach

    def key(self) -> tuple[bool, bool, float, str]:
        return (not self.spare, self.upstream, self.seconds_after, self.node.node_id)


def choose_standbys(
    plan: bus_pb2.Plan,
    capacities: Sequence[NodeCapacity],
    footprint: ModelFootprint,
    live: Mapping[str, bus_pb2.Heartbeat],
) -> tuple[list[bus_pb2.PlanStandby], list[str]]:
    """The standbys `plan` asks of the `live` nodes, and a reason line for each stage."""
    by_id = {c.node_id: c for c in capacities}
    serving = {s.node_id: s for s in plan.stages}
    busy: set[str] = set()
    standbys, reasons = [], []
    stages = sorted(plan.stages, key=lambda s: (-footprint.stage_bytes(s.start, s.end), s.pipeline, s.start))
    for stage in stages:
        candidates = [
            candidate
            for node_id, node in by_id.items()
            if node_id in live and node_id != stage.node_id and node_id not in busy
            for candidate in [_candidate(node, serving.get(node_id), stage, footprint)]
            if candidate is not None
        ]
        layers = f"layers [{stage.start}, {stage.end})"
        if not candidates:
            reasons.append(
                f"standby: none for {stage.node_id}'s {layers} (no node has the memory beside its own)"
            )
            continue
        best = min(candidates, key=_Candidate.key)
        busy.add(best.node.node_id)
        standbys.append(
            bus_pb2.PlanStandby(
                node_id=best.node.node_id,
                start=stage.start,
                end=stage.end,
                node_started_at_ms=live[best.node.node_id].started_at_ms,
                covers=stage.node_id,
                pipeline=stage.pipeline,
            )
        )
        how = "a spare" if best.spare else "its neighbour, widening its stage"
        if not best.spare and not best.upstream:
            how += ", its KV mirrored there"
        reasons.append(
            f"standby: {best.node.node_id} holds {stage.node_id}'s {layers} warm ({how}; "
            f"{footprint.stage_bytes(stage.start, stage.end) / 2**20:.1f} MiB)"
        )
    return standbys, reasons


def _candidate(
    node: NodeCapacity, own: bus_pb2.PlanStage | None, stage: bus_pb2.PlanStage, footprint: ModelFootprint
) -> _Candidate | None:
    """`node` as the holder of `stage`'s range, if it can take the stage over from it."""
    if own is None:  # a spare takes the stage as it is
        needed = footprint.stage_bytes(stage.start, stage.end)
        if needed > node.memory_bytes or not node.can_hold(stage.start, stage.end):
            return None
        return _Candidate(node, True, (stage.end - stage.start) * node.seconds_per_layer)
    if own.pipeline != stage.pipeline or (own.end != stage.start and stage.end != own.start):
        return None  # only a neighbour can widen its stage by the range
    start, end = min(own.start, stage.start), max(own.end, stage.end)
    held = footprint.stage_bytes(own.start, own.end) + footprint.stage_bytes(stage.start, stage.end)
    if held > node.memory_bytes or not node.can_hold(start, end):
        return None
    return _Candidate(node, False, (end - start) * node.seconds_per_layer, upstream=own.end == stage.start)


def holds_warm(standby: bus_pb2.PlanStandby, live: Mapping[str, bus_pb2.Heartbeat]) -> bool:
    """Whether the holder lives as the run the standby was asked of and reports the range loaded."""
    hb = live.get(standby.node_id)
    return (
        hb is not None
        and (standby.node_started_at_ms in (0, hb.started_at_ms))
        and (hb.standby_layer_start, hb.standby_layer_end) == (standby.start, standby.end)
    )


def repair(
    current: bus_pb2.Plan | None,
    footprint: ModelFootprint,
    live: Mapping[str, bus_pb2.Heartbeat],
    capacities: Sequence[NodeCapacity],
) -> list[tuple[Pipeline, Plan]]:
    """Each pipeline of `current` that lost a stage's node and can be re-formed from warm standbys
    alone, with its placement (see the module doc)."""
    if not plans_model(current, footprint):
        return []
    by_id = {c.node_id: c for c in capacities}
    in_stages = {s.node_id for s in current.stages}
    repaired = []
    for pipeline in pipelines(current):
        dead = [s for s in pipeline.stages if not runs_on(s, live)]
        if not dead:
            continue
        ranges = {s.node_id: (s.start, s.end) for s in pipeline.stages if s not in dead}
        took: list[str] = []
        for stage in dead:
            standby = next(
                (
                    sb
                    for sb in current.standbys
                    if sb.covers == stage.node_id and sb.pipeline == pipeline.id and holds_warm(sb, live)
                ),
                None,
            )
            if standby is None or standby.node_id not in by_id:
                break
            holder = standby.node_id
            if holder in ranges:  # the neighbour widens its stage
                start, end = ranges[holder]
                ranges[holder] = (min(start, stage.start), max(end, stage.end))
            elif holder not in in_stages:  # a spare takes the stage
                ranges[holder] = (stage.start, stage.end)
            else:
                break
            took.append(f"{holder} took {stage.node_id}'s layers [{stage.start}, {stage.end}) warm")
        else:
            placed = sorted(
                (
                    stage_placement(footprint, by_id[node_id], start, end)
                    for node_id, (start, end) in ranges.items()
                ),
                key=lambda s: s.start,
            )
            reason = f"repaired from standbys, nothing loaded: {'; '.join(took)}"
            repaired.append((pipeline, Plan(footprint.model_id, tuple(placed), (reason,))))
    return repaired
