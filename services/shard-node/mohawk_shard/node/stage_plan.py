"""What a shard node does with a plan, as a plain decision: keep its stage, load another (beside
the running one, or after stopping it), switch to the one loaded beside, or leave the plan.

Design. The node serves the one pipeline of a plan that names it (`view_of`). A plan that keeps
that pipeline as it was (same epoch, stages and KV: `same_assignment`) changes nothing (`KEEP`),
so plan changes elsewhere in the cluster never interrupt it. A plan that gives the node another
stage (`LOAD`) makes before it breaks where it can (`Decision.serve_on`): the running stage
serves on while the new one loads beside it, and the node switches once the new pipeline is active
(`SWITCH`; until then `WAIT`). It can when make before break is on and every node of the running
pipeline still lives (`serves_on`: a pipeline that lost a node cannot serve, so its survivors free
their memory first), and memory has room for both, which the follower measures once the stage
loaded beside for an earlier plan is let go; otherwise it stops the running stage first. A plan
that leaves the node out stops its stage (`STOP`), but only once a pipeline of the plan is active
when the running one can serve on (`SERVE_ON`). `StageFollower` carries the decisions out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mohawk_common.bus.pipelines import pipelines
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.pipeline_view import PipelineView


class Action(enum.Enum):
    KEEP = "keep"  # the running stage already is the one the plan asks for
    WAIT = "wait"  # the stage loaded beside is the one asked for; its pipeline is not active yet
    SWITCH = "switch"  # ... and its pipeline is active: serve it, stop the old one
    LOAD = "load"  # load the new stage: beside the running one (`serve_on`, memory allowing) or in its place
    SERVE_ON = "serve on"  # left out of the plan: serve on until a pipeline of it is active
    STOP = "stop"  # left out of the plan: stop and free the memory


@dataclass(frozen=True, slots=True)
class StageAssignment:
    """Stage `index` of the pipeline `view`."""

    view: PipelineView
    index: int


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    placement: StageAssignment | None = None  # the stage the plan asks for (None: the node is left out)
    serve_on: bool = False  # LOAD: the running stage may serve on while the new one loads beside it

    @property
    def is_active(self) -> bool:
        """Whether the pipeline asked for is active (stage 0 starts pulling requests then)."""
        return self.placement is not None and self.placement.view.active


def serves_on(serving: PipelineView | None, plan: bus_pb2.Plan, *, make_before_break: bool) -> bool:
    """Whether the running stage, of the pipeline `serving`, can go on serving while `plan` loads:
    make before break is on, and every node of its pipeline still lives (`plan` names it somewhere)."""
    if serving is None or not make_before_break:
        return False
    alive = {s.node_id for s in plan.stages} | set(plan.spares) | set(plan.quarantined)
    return all(s.node_id in alive for s in serving.stages)


def decide(
    plan: bus_pb2.Plan,
    asked: StageAssignment | None,
    *,
    serving: StageAssignment | None,
    upcoming: StageAssignment | None,
    make_before_break: bool,
) -> Decision:
    """What to do with `plan`, which asks this node for `asked` (None: nothing), while it serves
    `serving` and has `upcoming` loaded beside it (None: none)."""
    can_serve_on = serves_on(serving.view if serving else None, plan, make_before_break=make_before_break)
    if asked is None:
        new_is_active = any(p.active for p in pipelines(plan))
        return Decision(Action.SERVE_ON if can_serve_on and not new_is_active else Action.STOP)
    if serving is not None and _same(serving, asked):
        return Decision(Action.KEEP, asked)
    if upcoming is not None and _same(upcoming, asked):
        return Decision(Action.SWITCH if asked.view.active else Action.WAIT, asked)
    return Decision(Action.LOAD, asked, serve_on=can_serve_on)


def _same(a: StageAssignment, b: StageAssignment) -> bool:
    """Whether two placements ask the same of the pipeline's nodes (the pipeline's state aside)."""
    return a.index == b.index and a.view.same_assignment(b.view)
