"""What a node does with a plan, as a plain decision (`stage_plan.decide`): keep, load (beside the
running stage where it can serve on), wait for or switch to the stage loaded beside, serve on
or stop when left out."""

from __future__ import annotations

import pytest

from mohawk_common.bus.pipelines import ACTIVE, LOADING
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.pipeline_view import view_of
from mohawk_shard.node.stage_plan import Action, StageAssignment, decide, serves_on

NODE = "n1"


def plan(
    version: int,
    *ranges: tuple[str, int, int],
    state: str = ACTIVE,
    spares: tuple[str, ...] = (),
    num_kv_blocks: int = 8,
) -> bus_pb2.Plan:
    stages = [bus_pb2.PlanStage(node_id=n, start=a, end=b) for n, a, b in ranges]
    return bus_pb2.Plan(
        version=version,
        model="m",
        num_layers=30,
        stages=stages,
        spares=list(spares),
        num_kv_blocks=num_kv_blocks,
        block_size=16,
        state=state,
    )


def asked(p: bus_pb2.Plan, node_id: str = NODE) -> StageAssignment | None:
    found = view_of(p, node_id)
    return StageAssignment(*found) if found is not None else None


def placed(p: bus_pb2.Plan) -> StageAssignment:
    found = asked(p)
    assert found is not None
    return found


V1 = plan(1, ("n1", 0, 15), ("n2", 15, 30))
V2_OTHER_STAGE = plan(2, ("n2", 0, 15), ("n1", 15, 30), state=LOADING)


def test_a_node_given_nothing_yet_loads_in_place() -> None:
    decision = decide(V1, asked(V1), serving=None, upcoming=None, make_before_break=True)
    assert decision.action == Action.LOAD and not decision.serve_on
    assert decision.placement == placed(V1) and decision.is_active


def test_the_same_pipeline_again_is_kept_whatever_its_state() -> None:
    again = plan(1, ("n1", 0, 15), ("n2", 15, 30), state=LOADING)
    decision = decide(again, asked(again), serving=placed(V1), upcoming=None, make_before_break=True)
    assert decision.action == Action.KEEP and not decision.is_active


def test_another_stage_loads_beside_while_the_pipeline_lives_and_make_before_break_is_on() -> None:
    beside = decide(
        V2_OTHER_STAGE, asked(V2_OTHER_STAGE), serving=placed(V1), upcoming=None, make_before_break=True
    )
    assert beside.action == Action.LOAD and beside.serve_on and not beside.is_active
    off = decide(
        V2_OTHER_STAGE, asked(V2_OTHER_STAGE), serving=placed(V1), upcoming=None, make_before_break=False
    )
    assert off.action == Action.LOAD and not off.serve_on


def test_a_pipeline_that_lost_a_node_cannot_serve_on() -> None:
    lost_n2 = plan(2, ("n1", 0, 30), state=LOADING)  # n2 is gone: its pipeline cannot serve
    decision = decide(lost_n2, asked(lost_n2), serving=placed(V1), upcoming=None, make_before_break=True)
    assert decision.action == Action.LOAD and not decision.serve_on
    assert serves_on(
        placed(V1).view, plan(2, ("n1", 0, 30), spares=("n2",)), make_before_break=True
    )  # a spare lives


@pytest.mark.parametrize(("state", "action"), [(LOADING, Action.WAIT), (ACTIVE, Action.SWITCH)])
def test_the_stage_loaded_beside_is_switched_to_once_its_pipeline_is_active(
    state: str, action: Action
) -> None:
    upcoming = placed(V2_OTHER_STAGE)
    again = plan(2, ("n2", 0, 15), ("n1", 15, 30), state=state)
    decision = decide(again, asked(again), serving=placed(V1), upcoming=upcoming, make_before_break=True)
    assert decision.action == action


def test_a_plan_that_changes_the_stage_loaded_beside_loads_again() -> None:
    other_kv = plan(3, ("n2", 0, 15), ("n1", 15, 30), state=LOADING, num_kv_blocks=4)
    decision = decide(
        other_kv, asked(other_kv), serving=placed(V1), upcoming=placed(V2_OTHER_STAGE), make_before_break=True
    )
    assert decision.action == Action.LOAD and decision.serve_on


def test_left_out_the_node_serves_on_until_a_pipeline_of_the_plan_is_active() -> None:
    loading = plan(2, ("n2", 0, 30), state=LOADING, spares=("n1",))
    decision = decide(loading, asked(loading), serving=placed(V1), upcoming=None, make_before_break=True)
    assert decision.action == Action.SERVE_ON and decision.placement is None
    active = plan(2, ("n2", 0, 30), state=ACTIVE, spares=("n1",))
    assert (
        decide(active, asked(active), serving=placed(V1), upcoming=None, make_before_break=True).action
        == Action.STOP
    )
    off = decide(loading, asked(loading), serving=placed(V1), upcoming=None, make_before_break=False)
    assert off.action == Action.STOP
    assert decide(loading, None, serving=None, upcoming=None, make_before_break=True).action == Action.STOP
