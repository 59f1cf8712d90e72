"""Replicas: how many pipelines the live nodes form, and which nodes each gets.

Design. A pipeline is a chain of nodes that holds the whole model; several pipelines serve one
model side by side, and their stage-0 nodes pull from one shared consumer of the request stream,
so a request goes to whichever pipeline has room first (least-queue routing). `replicas: N` asks
for N pipelines, `auto` for as many as the nodes can hold. The nodes are sorted by speed and dealt
out in snake order (0, 1, …, k-1, k-1, …, 0) into k groups, so every group gets a fair mix of fast
and slow nodes; each group is then placed with the ordinary planner (`plan_placement`, pack or
spread). The largest k ≤ N for which every group can hold the model wins; nodes a group's placement
leaves out, and nodes beyond what N pipelines need, are spares. With more than one pipeline asked
for, a replan keeps every pipeline of the current plan whose nodes all still live (same id, epoch
and stages: its nodes never notice the change) and forms new pipelines only from the rest, the
spares included: a failed stage is replaced by a spare while the other pipelines keep serving,
and a new node waits as a spare instead of reshuffling pipelines that work. With `replicas: 1`
every replan places all live nodes afresh, as a single pipeline, which lets a joining node take
layers (the memory-driven split a model too big for one node needs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, TypeGuard

from mohawk_common.bus.pipelines import Pipeline, pipelines, placed_on
from mohawk_coordinator.planner import (
    ModelFootprint,
    NodeCapacity,
    Placement,
    Plan,
    PlanningError,
    plan_placement,
)
from mohawk_proto.v1 import bus_pb2

Replicas = int | Literal["auto"]


def form_pipelines(
    model: ModelFootprint, nodes: Sequence[NodeCapacity], policy: Placement, count: int | None
) -> list[Plan]:
    """Up to `count` (None: as many as possible) disjoint pipelines from `nodes`, most first.

    Raises `PlanningError` (the single-pipeline reason) when the nodes cannot form even one."""
    ordered = sorted(nodes, key=lambda n: (n.seconds_per_layer, n.node_id))
    most = len(ordered) if count is None else min(count, len(ordered))
    for k in range(most, 1, -1):
        try:
            return [plan_placement(model, group, policy) for group in _deal(ordered, k)]
        except PlanningError:
            continue
    return [plan_placement(model, ordered, policy)]


def _deal(ordered: Sequence[NodeCapacity], k: int) -> list[list[NodeCapacity]]:
    """`ordered` into k groups in snake order, so fast and slow nodes mix evenly."""
    groups: list[list[NodeCapacity]] = [[] for _ in range(k)]
    for index, node in enumerate(ordered):
        lap, slot = divmod(index, k)
        groups[slot if lap % 2 == 0 else k - 1 - slot].append(node)
    return groups


def kept_pipelines(
    current: bus_pb2.Plan | None, model: ModelFootprint, live: Mapping[str, bus_pb2.Heartbeat]
) -> list[Pipeline]:
    """The pipelines of `current` that can go on serving as they are: same model, every node live
    as the incarnation the stage was placed on."""
    if not plans_model(current, model):
        return []
    return [p for p in pipelines(current) if p.stages and all(runs_on(s, live) for s in p.stages)]


def plans_model(current: bus_pb2.Plan | None, model: ModelFootprint) -> TypeGuard[bus_pb2.Plan]:
    """Whether `current` is a plan of this very model (its id and layer count)."""
    return current is not None and (current.model_id, current.num_layers) == (
        model.model_id,
        model.num_layers,
    )


def runs_on(stage: bus_pb2.PlanStage, live: Mapping[str, bus_pb2.Heartbeat]) -> bool:
    """The node of `stage` lives, as the same run (a restarted node lost the stage's KV)."""
    hb = live.get(stage.node_id)
    return hb is not None and placed_on(stage, hb.started_at_ms)


def replicas_reason(replicas: Replicas, kept: int, formed: int, spares: int) -> str:
    asked = "as many pipelines as the nodes hold" if replicas == "auto" else f"{replicas} pipeline(s)"
    parts = [f"replicas {replicas}: {asked}; {kept + formed} serving"]
    if kept:
        parts.append(f"{kept} kept as they were (every node live)")
    if spares:
        parts.append(f"{spares} spare node(s) left to replace a failed stage")
    return ", ".join(parts)
