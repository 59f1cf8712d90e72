"""The pipelines of a plan, and the view of it one node serves.

A plan may hold several pipelines (replicas), each a chain of stages over the whole model; its
`stages` list all of them, each tagged with its pipeline's id. A node serves its own pipeline
only, and sees it as a plan of its own (`node_view`): that pipeline's stages, KV blocks and
context length, its epoch as the version (frames and subjects carry it), `active` as the state.
A pipeline keeps its id and epoch for as long as the coordinator keeps it unchanged, so its nodes
keep serving across plan versions (`same_assignment`) while other pipelines form or break.
A plan written before pipelines existed has none listed: it reads as one pipeline, id 0, of
every stage, with the plan's own version, state, KV blocks and context length.
"""

from __future__ import annotations

from dataclasses import dataclass

from mohawk_proto.v1 import bus_pb2

ACTIVE = "active"
LOADING = "loading"


@dataclass(frozen=True, slots=True)
class Pipeline:
    id: int
    epoch: int
    active: bool
    num_kv_blocks: int
    max_model_len: int
    stages: tuple[bus_pb2.PlanStage, ...]

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(s.node_id for s in self.stages)


def pipelines(plan: bus_pb2.Plan) -> list[Pipeline]:
    """The plan's pipelines by id, each with its stages in order."""
    if not plan.pipelines:
        if not plan.stages:
            return []
        stages = tuple(plan.stages)
        return [
            Pipeline(0, plan.version, plan.state == ACTIVE, plan.num_kv_blocks, plan.max_model_len, stages)
        ]
    return [
        Pipeline(
            p.id,
            p.epoch,
            p.active,
            p.num_kv_blocks,
            p.max_model_len,
            tuple(s for s in plan.stages if s.pipeline == p.id),
        )
        for p in sorted(plan.pipelines, key=lambda p: p.id)
    ]


def node_view(plan: bus_pb2.Plan, node_id: str) -> tuple[bus_pb2.Plan, int] | None:
    """The plan of the one pipeline `node_id` serves and its stage index in it; None if it has none."""
    for pipeline in pipelines(plan):
        for index, stage in enumerate(pipeline.stages):
            if stage.node_id == node_id:
                return _view(plan, pipeline), index
    return None


def _view(plan: bus_pb2.Plan, pipeline: Pipeline) -> bus_pb2.Plan:
    view = bus_pb2.Plan(
        version=pipeline.epoch,
        model=plan.model,
        model_id=plan.model_id,
        num_layers=plan.num_layers,
        stages=pipeline.stages,
        num_kv_blocks=pipeline.num_kv_blocks,
        block_size=plan.block_size,
        max_model_len=pipeline.max_model_len,
        state=ACTIVE if pipeline.active else LOADING,
        leader=plan.leader,
        created=plan.created,
    )
    list_pipeline(view, pipeline)
    return view


def list_pipeline(plan: bus_pb2.Plan, pipeline: Pipeline) -> None:
    """Add `pipeline`'s entry (id, epoch, state, KV blocks, context) to `plan.pipelines`."""
    plan.pipelines.add(
        id=pipeline.id,
        epoch=pipeline.epoch,
        active=pipeline.active,
        num_kv_blocks=pipeline.num_kv_blocks,
        max_model_len=pipeline.max_model_len,
    )


def placed_on(stage: bus_pb2.PlanStage, started_at_ms: int) -> bool:
    """Whether `stage` was placed on the run of its node that started at `started_at_ms` (its
    heartbeat's incarnation). A restarted node lost the stage's KV and requests, so a plan made
    for its earlier run is not for it; a stage from before incarnations were recorded names none."""
    return stage.node_started_at_ms in (0, started_at_ms)


def pipeline_id(view: bus_pb2.Plan) -> int:
    """The pipeline a node's view is of (0 for a plan without pipelines)."""
    return view.pipelines[0].id if view.pipelines else 0


def same_assignment(a: bus_pb2.Plan, b: bus_pb2.Plan) -> bool:
    """Whether two node views ask the same of the pipeline's nodes (its state aside): then a node
    keeps serving through the plan change."""

    def key(view: bus_pb2.Plan) -> tuple[object, ...]:
        stages = tuple((s.node_id, s.start, s.end) for s in view.stages)
        return (
            view.version,
            pipeline_id(view),
            stages,
            view.num_kv_blocks,
            view.block_size,
            view.max_model_len,
        )

    return key(a) == key(b)
