"""From live heartbeats to a `bus_pb2.Plan`: the model's footprint, node capacities, KV blocks.

Design. The coordinator never opens the model: every shard node reports the model's shape
(layers, hidden size, vocab, KV heads, head dim, context) and its own weight bytes (one decoder
layer as it holds it, in the format it loads; the embedding; the final norm + LM head) in its
heartbeat. The nodes of one model must agree on the shape, or nothing is planned. Bytes may
differ between nodes (one keeps bf16, another fp32 or int4): the planner takes one footprint for
all, the largest each node reports, so a stage fits whichever node gets it and the plan errs on
the safe side. Until some live node has reported a shape there is nothing to plan.

How KV enters the footprint: it does not enter `layer_bytes`. A node sizes its KV pool itself and
reports it as `kv_cache_bytes`, part of `memory_limit_bytes`; so the planner places weights only,
in what is left (`memory_limit_bytes - kv_cache_bytes`), and the pool of each stage is then shared
by the layers it got: `num_kv_blocks = min over stages of kv_cache_bytes // (num_layers ×
kv_block_bytes_per_layer)`, the same block count on every stage because stage 0 hands out block
ids for all of them. The plan's reasons name the stage that limits it. A node that does not report
`kv_block_bytes_per_layer` is assumed to keep float32 KV. A model with sliding-window layers
(reported as `layer_windows`) has several KV groups sharing the block ids (`mohawk_common.kv_groups`):
a block id then costs a stage only `page_layers` layers' KV (the most one group has in it), and
context is bounded by what one sequence's blocks in every group (a sliding group's window only) fit.

Speeds are rounded to two significant digits before planning so that measurement noise cannot
flip a plan; a node that has not measured yet is taken to be as slow as the slowest one that has.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mohawk_common.bus.pipelines import ACTIVE, LOADING, list_pipeline, pipelines, placed_on
from mohawk_common.kv_groups import KVGroup, group_of_layer, kv_groups, max_tokens_in, page_layers
from mohawk_coordinator.config import CoordinatorSettings
from mohawk_coordinator.planner import ModelFootprint, NodeCapacity, PlanningError
from mohawk_coordinator.replicas import form_pipelines, kept_pipelines, replicas_reason
from mohawk_coordinator.standbys import choose_standbys, repair
from mohawk_proto.v1 import bus_pb2

FP32_BYTES = 4
INT32_MAX = 2**31 - 1
UNMEASURED_SECONDS_PER_LAYER = 1e-3  # when no node has measured its speed yet


class ShapeMismatchError(PlanningError):
    """The nodes of one model report different shapes (different model files)."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the coordinator needs to know of the served model."""

    footprint: ModelFootprint
    max_position_embeddings: int
    kv_bytes_per_token_per_layer: int  # K and V of one token in one layer, float32
    weights_formats: tuple[str, ...] = ()  # as the nodes reported them, for explain
    kv_groups: tuple[KVGroup, ...] = ()  # from the nodes' layer_windows; () = one full group

    def page_layers(self, start: int, end: int) -> int:
        """Layers of [start, end) whose KV one block id holds."""
        if not self.kv_groups:
            return end - start
        return page_layers(group_of_layer(self.kv_groups, self.footprint.num_layers), start, end)

    @classmethod
    def from_heartbeats(cls, heartbeats: Iterable[bus_pb2.Heartbeat]) -> ModelShape | None:
        """The shape the nodes report (None until one does); raises ShapeMismatchError when they
        disagree. Weight bytes are the largest any node reports (see the design note)."""
        beats = [hb for hb in heartbeats if hb.num_layers > 0]
        if not beats:
            return None
        shapes = {_shape_key(hb) for hb in beats}
        if len(shapes) > 1:
            described = "; ".join(sorted(f"{hb.node_id}: {_shape_key(hb)}" for hb in beats))
            raise ShapeMismatchError(f"the nodes do not serve the same model ({described})")
        first = beats[0]
        footprint = ModelFootprint(
            first.model_id,
            num_layers=first.num_layers,
            layer_bytes=max(hb.layer_weight_bytes for hb in beats),
            embedding_bytes=max(hb.embedding_weight_bytes for hb in beats),
            head_bytes=max(hb.head_weight_bytes for hb in beats),
        )
        kv_per_token = 2 * first.num_kv_heads * first.head_dim * FP32_BYTES
        formats = tuple(sorted({hb.weights_format for hb in beats if hb.weights_format}))
        groups = kv_groups([w or None for w in first.layer_windows]) if first.layer_windows else ()
        return cls(footprint, first.max_position_embeddings, kv_per_token, formats, groups)


def _shape_key(hb: bus_pb2.Heartbeat) -> tuple[str, int, int, int, int, int, int]:
    return (
        hb.model_id,
        hb.num_layers,
        hb.hidden_size,
        hb.vocab_size,
        hb.num_kv_heads,
        hb.head_dim,
        hb.max_position_embeddings,
    )


def quantize_seconds(seconds: float) -> float:
    """`seconds` to two significant digits (0.0012345 → 0.0012)."""
    return float(f"{seconds:.2g}") if seconds > 0 else 0.0


def node_capacities(heartbeats: Iterable[bus_pb2.Heartbeat]) -> list[NodeCapacity]:
    """What each node offers the planner: weight memory (KV pool excluded) and rounded speed."""
    beats = list(heartbeats)
    measured = [quantize_seconds(hb.seconds_per_layer) for hb in beats if hb.seconds_per_layer > 0]
    unmeasured = max(measured, default=UNMEASURED_SECONDS_PER_LAYER)
    return [
        NodeCapacity(
            hb.node_id,
            max(0, hb.memory_limit_bytes - hb.kv_cache_bytes),
            quantize_seconds(hb.seconds_per_layer) or unmeasured,
            hb.backend,
            hb.device,
            (hb.held_layer_start, hb.held_layer_end) if hb.held_layer_end > 0 else None,
        )
        for hb in beats
    ]


def build_plan(
    shape: ModelShape,
    heartbeats: Iterable[bus_pb2.Heartbeat],
    settings: CoordinatorSettings,
    current: bus_pb2.Plan | None = None,
) -> bus_pb2.Plan:
    """The plan for these nodes (version, leader and time left for the publisher to fill in; a new
    pipeline's epoch is 0 until the publisher gives it the new version). With more than one
    replica asked for, the pipelines of `current` whose nodes all live are kept (replicas.py).

    Raises `PlanningError` when the nodes cannot hold the model or a stage has no room for KV.
    """
    nodes = {hb.node_id: hb for hb in heartbeats}
    footprint = shape.footprint
    capacities = node_capacities(nodes.values())
    kept = kept_pipelines(current, footprint, nodes) if settings.replicas != 1 else []
    repaired = repair(current, footprint, nodes, capacities) if settings.standbys else []
    taken = {node_id for pipeline in kept for node_id in pipeline.node_ids}
    taken |= {s.node_id for _, placement in repaired for s in placement.stages}
    free = [c for c in capacities if c.node_id not in taken]
    wanted = None if settings.replicas == "auto" else settings.replicas - len(kept) - len(repaired)
    formed = []
    if free and (wanted is None or wanted > 0):
        try:
            formed = form_pipelines(footprint, free, settings.placement, wanted)
        except PlanningError:
            if not kept and not repaired:
                raise
    plan = bus_pb2.Plan(
        model=settings.served_model,
        model_id=footprint.model_id,
        num_layers=footprint.num_layers,
        block_size=settings.block_size,
    )
    for pipeline in kept:
        list_pipeline(plan, pipeline)
        plan.stages.extend(pipeline.stages)
    slots = {p.id for p in kept} | {p.id for p, _ in repaired}
    free_ids = (i for i in itertools.count() if i not in slots)
    many = len(kept) + len(repaired) + len(formed) > 1
    placed = [(old.id, placement) for old, placement in repaired]
    placed += [(next(free_ids), placement) for placement in formed]
    for pipeline_id, placement in placed:
        stages = [
            bus_pb2.PlanStage(
                node_id=s.node_id,
                start=s.start,
                end=s.end,
                pipeline=pipeline_id,
                node_started_at_ms=nodes[s.node_id].started_at_ms,
            )
            for s in placement.stages
        ]
        num_kv_blocks, kv_reason = kv_blocks(shape, stages, nodes, settings.block_size)
        max_model_len, len_reason = context_length(shape, settings, num_kv_blocks)
        plan.pipelines.add(id=pipeline_id, num_kv_blocks=num_kv_blocks, max_model_len=max_model_len)
        plan.stages.extend(stages)
        prefix = f"pipeline {pipeline_id}: " if many else ""
        plan.reasons.extend(f"{prefix}{reason}" for reason in (*placement.reasons, kv_reason, len_reason))
    in_use = {s.node_id for s in plan.stages}
    plan.spares.extend(sorted(set(nodes) - in_use))
    plan.num_kv_blocks = min(p.num_kv_blocks for p in plan.pipelines)
    plan.max_model_len = min(p.max_model_len for p in plan.pipelines)
    plan.state = ACTIVE if any(p.active for p in plan.pipelines) else LOADING
    if settings.replicas != 1 or many:
        plan.reasons.insert(
            0, replicas_reason(settings.replicas, len(kept), len(repaired) + len(formed), len(plan.spares))
        )
    if settings.standbys:
        standbys, reasons = choose_standbys(plan, capacities, footprint, nodes)
        plan.standbys.extend(standbys)
        plan.reasons.extend(reasons)
    return plan


def kv_blocks(
    shape: ModelShape,
    stages: Iterable[bus_pb2.PlanStage],
    nodes: Mapping[str, bus_pb2.Heartbeat],
    block_size: int,
) -> tuple[int, str]:
    """Blocks every stage can hold (the smallest stage pool decides) and the reason, for explain."""
    per_stage = []
    for stage in stages:
        node = nodes[stage.node_id]
        per_layer = node.kv_block_bytes_per_layer or block_size * shape.kv_bytes_per_token_per_layer
        layers = shape.page_layers(stage.start, stage.end)
        per_stage.append((node.kv_cache_bytes // (layers * per_layer), stage, node))
    num_blocks, stage, node = min(per_stage, key=lambda item: (item[0], item[1].start))
    budget = f"{node.kv_cache_bytes / 2**20:.1f} MiB of KV for {stage.end - stage.start} layer(s)"
    if shape.kv_groups:
        layers = shape.page_layers(stage.start, stage.end)
        budget += f", {layers} a block id in {len(shape.kv_groups)} KV groups"
    if num_blocks < 1:
        raise PlanningError(f"{node.node_id} has no room for one KV block: {budget}")
    num_blocks = min(num_blocks, INT32_MAX)
    return num_blocks, f"{num_blocks} KV blocks of {block_size} tokens, set by {node.node_id} ({budget})"


def context_length(shape: ModelShape, settings: CoordinatorSettings, num_kv_blocks: int) -> tuple[int, str]:
    """max_model_len: the least of the model's own, the setting, and what the KV blocks hold."""
    limits = [(shape.max_position_embeddings, "the model's max_position_embeddings")]
    if settings.max_model_len is not None:
        limits.append((settings.max_model_len, "the max_model_len setting"))
    if shape.kv_groups:  # what one decoding sequence's blocks fit (a sliding group holds its window)
        longest = max(length for length, _ in limits)
        fits = max_tokens_in(shape.kv_groups, num_kv_blocks, settings.block_size, longest)
        limits.append((fits, "the KV blocks"))
    else:
        limits.append((num_kv_blocks * settings.block_size, "the KV blocks"))
    length, why = min(limits, key=lambda item: item[0])
    return min(length, INT32_MAX), f"max_model_len {min(length, INT32_MAX)}, limited by {why}"


def same_placement(a: bus_pb2.Plan, b: bus_pb2.Plan) -> bool:
    """Whether two plans ask the same of every node incarnation (version, epochs, states, leader,
    time and signature aside)."""

    def key(plan: bus_pb2.Plan) -> tuple[object, ...]:
        lines = tuple(
            (
                p.id,
                tuple((s.node_id, s.node_started_at_ms, s.start, s.end) for s in p.stages),
                p.num_kv_blocks,
                p.max_model_len,
            )
            for p in pipelines(plan)
        )
        standbys = tuple((b.node_id, b.node_started_at_ms, b.start, b.end, b.covers) for b in plan.standbys)
        return (
            plan.model,
            plan.model_id,
            plan.num_layers,
            lines,
            plan.block_size,
            tuple(plan.spares),
            standbys,
        )

    return key(a) == key(b)


def with_pipelines(plan: bus_pb2.Plan) -> bus_pb2.Plan:
    """`plan` with its pipelines listed (a plan from before pipelines existed lists none)."""
    if plan.pipelines or not plan.stages:
        return plan
    listed = bus_pb2.Plan()
    listed.CopyFrom(plan)
    for pipeline in pipelines(plan):
        list_pipeline(listed, pipeline)
    return listed


def activate_ready(plan: bus_pb2.Plan, live: Mapping[str, bus_pb2.Heartbeat]) -> bus_pb2.Plan | None:
    """`plan` with every pipeline whose nodes all report this version loaded marked active; None
    when no pipeline changes."""

    def loaded(stage: bus_pb2.PlanStage) -> bool:
        hb = live.get(stage.node_id)
        return (
            hb is not None
            and placed_on(stage, hb.started_at_ms)
            and hb.plan_version == plan.version
            and hb.loaded
        )

    ready = {p.id for p in pipelines(plan) if not p.active and p.stages and all(map(loaded, p.stages))}
    if not ready:
        return None
    active = bus_pb2.Plan()
    active.CopyFrom(with_pipelines(plan))
    for pipeline in active.pipelines:
        pipeline.active = pipeline.active or pipeline.id in ready
    active.state = ACTIVE
    return active


def can_adopt(
    stored: bus_pb2.Plan | None,
    shape: ModelShape,
    live: Mapping[str, bus_pb2.Heartbeat],
    settings: CoordinatorSettings,
) -> bool:
    """Whether a new leader may keep the stored plan: same model, every stage's node live as the
    run it was placed on (a plan from an earlier run of the cluster never is), nothing to gain."""
    if stored is None or stored.model != settings.served_model:
        return False
    if stored.model_id != shape.footprint.model_id or stored.num_layers != shape.footprint.num_layers:
        return False
    stage_ids = {s.node_id for s in stored.stages}
    if not stage_ids or not stage_ids <= live.keys():
        return False
    if not all(placed_on(s, live[s.node_id].started_at_ms) for s in stored.stages):
        return False
    if stage_ids == live.keys():
        return True
    try:
        return same_placement(stored, build_plan(shape, live.values(), settings, stored))
    except PlanningError:
        return True
