"""`PipelineView` names what a node's view of its pipeline holds: its epoch (the version of the plan
that formed the pipeline, not the plan's own), its id, stages, KV pool and state."""

from __future__ import annotations

from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.pipeline_view import view_of


def two_pipelines(version: int) -> bus_pb2.Plan:
    plan = bus_pb2.Plan(version=version, model="m", num_layers=30, block_size=16, state="active")
    for pipeline_id, epoch, active, nodes in ((0, 3, True, ("a", "b")), (1, version, False, ("c", "d"))):
        plan.pipelines.add(id=pipeline_id, epoch=epoch, active=active, num_kv_blocks=64, max_model_len=512)
        for i, node in enumerate(nodes):
            plan.stages.add(node_id=node, start=15 * i, end=15 * (i + 1), pipeline=pipeline_id)
    return plan


def test_a_view_has_its_pipelines_epoch_not_the_plans_version() -> None:
    found = view_of(two_pipelines(9), "b")
    assert found is not None
    view, index = found
    assert (view.epoch, view.pipeline, index, view.active) == (3, 0, 1, True)
    assert [s.node_id for s in view.stages] == ["a", "b"] and view.num_stages == 2
    assert (view.num_kv_blocks, view.block_size, view.max_model_len, view.model) == (64, 16, 512, "m")
    loading = view_of(two_pipelines(9), "c")
    assert loading is not None and (loading[0].epoch, loading[0].pipeline, loading[0].active) == (9, 1, False)
    assert view_of(two_pipelines(9), "z") is None


def test_a_later_plan_that_keeps_a_pipeline_keeps_its_assignment() -> None:
    before, after = view_of(two_pipelines(9), "a"), view_of(two_pipelines(10), "a")
    assert before is not None and after is not None
    assert before[0].same_assignment(after[0])  # pipeline 0 still formed by version 3
    formed_again = view_of(two_pipelines(10), "c")
    earlier = view_of(two_pipelines(9), "c")
    assert formed_again is not None and earlier is not None
    assert not formed_again[0].same_assignment(earlier[0])  # pipeline 1 re-formed by version 10
