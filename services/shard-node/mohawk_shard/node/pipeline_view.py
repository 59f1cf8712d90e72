"""`PipelineView`: a node's view of the one pipeline it serves, named for what it holds.

Design. The plan a coordinator publishes (`bus_pb2.Plan`) has a version of its own and lists its
pipelines, each formed at some epoch. A node serves one of them and reads it as a `Plan` too
(`node_view`: the pipeline's stages, its KV pool, its state), a message whose `version` field then
holds the pipeline's epoch, the number its subjects (`mohawk.v1.act.<node>.<epoch>.<pipeline>.<stage>`),
channels and frames carry. Inside the node that value is `PipelineView.epoch` and a plan's
version is only ever the whole plan's: the wire format is unchanged, and the wire message stays at
hand (`plan`) for what reads it (`same_assignment`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mohawk_common.bus.pipelines import ACTIVE, node_view, pipeline_id, same_assignment
from mohawk_proto.v1 import bus_pb2


@dataclass(frozen=True, slots=True)
class PipelineView:
    plan: bus_pb2.Plan  # `node_view`'s message: its `version` is the pipeline's epoch

    @property
    def epoch(self) -> int:
        """The version of the plan that formed this pipeline (its subjects and frames carry it)."""
        return self.plan.version

    @property
    def pipeline(self) -> int:
        return pipeline_id(self.plan)

    @property
    def model(self) -> str:
        return self.plan.model

    @property
    def stages(self) -> list[bus_pb2.PlanStage]:
        return list(self.plan.stages)

    @property
    def num_stages(self) -> int:
        return len(self.plan.stages)

    @property
    def num_layers(self) -> int:
        return self.plan.num_layers

    @property
    def num_kv_blocks(self) -> int:
        return self.plan.num_kv_blocks

    @property
    def block_size(self) -> int:
        return self.plan.block_size

    @property
    def max_model_len(self) -> int:
        return self.plan.max_model_len

    @property
    def active(self) -> bool:
        """Whether every stage of the pipeline reported loaded (stage 0 pulls requests then)."""
        return self.plan.state == ACTIVE

    def same_assignment(self, other: PipelineView) -> bool:
        """Whether `other` asks the same of the pipeline's nodes (its state aside)."""
        return same_assignment(self.plan, other.plan)


def view_of(plan: bus_pb2.Plan, node_id: str) -> tuple[PipelineView, int] | None:
    """The pipeline of `plan` that `node_id` serves and its stage index in it; None if none."""
    found = node_view(plan, node_id)
    return (PipelineView(found[0]), found[1]) if found is not None else None
