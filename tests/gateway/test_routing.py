"""Routing a request to one of several pipelines: least queue, round robin, prefix affinity."""

from __future__ import annotations

from mohawk_common.bus import names
from mohawk_gateway.routing import Router, chat_affinity_key, prompt_affinity_key
from mohawk_proto.v1 import bus_pb2


def plan_of(*pipelines: tuple[int, bool]) -> bus_pb2.Plan:
    plan = bus_pb2.Plan(version=3, state="active")
    for pipeline_id, active in pipelines:
        plan.pipelines.add(id=pipeline_id, epoch=3, active=active)
        plan.stages.add(node_id=f"n{pipeline_id}", start=0, end=30, pipeline=pipeline_id)
    return plan


def test_least_queue_leaves_the_choice_to_whichever_stage_0_has_room() -> None:
    assert Router("least-queue").route(plan_of((0, True), (1, True)), b"k") is None


def test_round_robin_takes_the_active_pipelines_in_turn() -> None:
    router = Router("round-robin")
    plan = plan_of((0, True), (1, False), (2, True))
    assert [router.route(plan, b"") for _ in range(4)] == [0, 2, 0, 2]
    assert router.route(plan_of((0, False)), b"") is None  # nothing active: the shared subject
    assert router.route(None, b"") is None


def test_every_turn_of_a_conversation_goes_to_the_same_pipeline() -> None:
    router = Router("prefix-affinity")
    plan = plan_of((0, True), (1, True), (2, True))
    system = {"role": "system", "content": "Be brief."}
    first = [system, {"role": "user", "content": "Name a river."}]
    later = [*first, {"role": "assistant", "content": "The Nile."}, {"role": "user", "content": "Another?"}]
    assert chat_affinity_key(first) == chat_affinity_key(later)
    assert router.route(plan, chat_affinity_key(first)) == router.route(plan, chat_affinity_key(later))
    other = [system, {"role": "user", "content": "Name a bird."}]
    assert chat_affinity_key(other) != chat_affinity_key(first)
    assert prompt_affinity_key(list(range(300))) == prompt_affinity_key([*range(256), 7, 7])


def test_losing_a_pipeline_moves_only_the_conversations_it_had() -> None:
    router = Router("prefix-affinity")
    keys = [f"conversation {i}".encode() for i in range(200)]
    before = {k: router.route(plan_of((0, True), (1, True), (2, True)), k) for k in keys}
    after = {k: router.route(plan_of((0, True), (1, True), (2, False)), k) for k in keys}
    assert {before[k] for k in keys} == {0, 1, 2}  # spread over every pipeline
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == 2 for k in moved)


def test_routed_subjects_and_consumers_are_named_per_pipeline() -> None:
    assert names.request_subject("M 1", 2) == "mohawk.v1.req.m-1.p2"
    assert names.stage0_consumer("M 1", 2) == "stage0-m-1-p2"
    assert names.route_of_consumer("M 1", "stage0-m-1-p2") == 2
    assert names.route_of_consumer("M 1", "stage0-m-1") is None
    assert names.route_of_consumer("M 1", "stage0-other-p2") is None
