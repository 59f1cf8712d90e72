"""Which plans a process obeys: signed, for its model, never older than the last; a node never
loads a stage placed on an earlier run of itself; ready means the plan's nodes heartbeat now."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mohawk_common.bus import names
from mohawk_common.bus.control import encode_json
from mohawk_common.bus.control_records import RecordVerifier, sign_record
from mohawk_common.bus.plan_follower import (
    LiveNode,
    LiveNodes,
    PlanFollower,
    placed_on_earlier_run,
    serving_reason,
    stage_for,
)
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.identity import Identity
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle
from mohawk_proto.v1 import bus_pb2

RUN_1, RUN_2 = 1_700_000_000_000, 1_700_000_100_000


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki")
    init_pki(path)
    issue_node(path, "coord-a", "coordinator")
    issue_node(path, "node-a", "shard")
    return path


def identity(pki: Path, node_id: str, role: str) -> Identity:
    return load_bundle(pki / "nodes" / node_id, role=role).identity


def plan_of(version: int, *, active: bool = True, started: int = RUN_1) -> bus_pb2.Plan:
    plan = bus_pb2.Plan(version=version, model="m", leader="coord-a", state="active" if active else "loading")
    plan.stages.add(node_id="node-a", start=0, end=30, node_started_at_ms=started)
    plan.pipelines.add(id=0, epoch=version, active=active)
    return plan


class Rejections(list[str]):
    def __call__(self, exc: AuthenticationError) -> None:
        self.append(exc.reason)


def follower(pki: Path) -> tuple[PlanFollower, Rejections]:
    rejections = Rejections()
    trust = load_bundle(pki / "nodes" / "node-a", role="shard").trust
    return PlanFollower("m", RecordVerifier(trust), rejections), rejections


def test_signed_plans_are_followed_forward_and_replays_and_forgeries_are_counted(pki: Path) -> None:
    plans, rejections = follower(pki)
    coordinator = identity(pki, "coord-a", "coordinator")
    loading_5 = encode_json(sign_record(plan_of(5, active=False), coordinator, "plan"))
    active_5 = encode_json(sign_record(plan_of(5), coordinator, "plan"))
    assert plans.admit(loading_5) is not None
    assert plans.admit(active_5) is not None
    assert plans.admit(active_5) is not None  # the same record again (a watcher's redelivery)
    assert plans.admit(loading_5) is None  # the recorded `loading` copy, replayed after `active`
    forged = plan_of(1005)
    forged.stages[0].end = 10
    assert plans.admit(encode_json(forged)) is None  # unsigned
    signed_by_a_shard = plan_of(1006)
    signed_by_a_shard.leader = "node-a"
    assert (
        plans.admit(encode_json(sign_record(signed_by_a_shard, identity(pki, "node-a", "shard"), "plan")))
        is None
    )
    assert plans.admit(b"{not json") is None
    other_model = plan_of(9)
    other_model.model = "another"
    assert plans.admit(encode_json(other_model)) is None  # not ours: ignored, not counted
    assert rejections == ["replayed", "unsigned", "untrusted", "malformed"]
    assert plans.latest is not None and plans.latest.version == 5


def test_a_stage_placed_on_an_earlier_run_of_the_node_is_not_for_it() -> None:
    plan = plan_of(3, started=RUN_1)
    assert stage_for(plan, "node-a", RUN_1) is not None
    assert stage_for(plan, "node-a", RUN_2) is None
    assert placed_on_earlier_run(plan, "node-a", RUN_2)
    assert not placed_on_earlier_run(plan, "node-z", RUN_2)  # not named at all: not this rule's case
    legacy = plan_of(3, started=0)  # written before incarnations were recorded
    assert stage_for(legacy, "node-a", RUN_2) is not None


def test_ready_needs_every_node_of_an_active_pipeline_live_as_the_planned_run_and_loaded() -> None:
    plan = plan_of(4, started=RUN_1)

    def beat(started: int, loaded: bool = True) -> LiveNode:
        return LiveNode(bus_pb2.Heartbeat(node_id="node-a", started_at_ms=started, loaded=loaded), 100.0)

    assert serving_reason(plan, {"node-a": beat(RUN_1)}, now=101.0, ttl_s=5.0) is None
    assert "sends no heartbeat" in (serving_reason(plan, {}, now=101.0, ttl_s=5.0) or "")
    assert "sends no heartbeat" in (serving_reason(plan, {"node-a": beat(RUN_1)}, now=106.0, ttl_s=5.0) or "")
    assert "restarted" in (serving_reason(plan, {"node-a": beat(RUN_2)}, now=101.0, ttl_s=5.0) or "")
    assert "not loaded" in (serving_reason(plan, {"node-a": beat(RUN_1, False)}, now=101.0, ttl_s=5.0) or "")
    assert "not active" in (serving_reason(plan_of(4, active=False), {}, now=101.0, ttl_s=5.0) or "")


def test_live_nodes_keep_only_verified_heartbeats_on_their_own_subject(pki: Path) -> None:
    rejections = Rejections()
    trust = load_bundle(pki / "nodes" / "node-a", role="shard").trust
    clock = iter([10.0, 11.0, 12.0, 13.0]).__next__
    live = LiveNodes(RecordVerifier(trust), rejections, clock=clock)
    heartbeat = bus_pb2.Heartbeat(
        node_id="node-a", role="shard", loaded=True, started_at_ms=RUN_1, sequence=1, sent_at=time.time()
    )
    unsigned = encode_json(heartbeat)
    signed = encode_json(sign_record(heartbeat, identity(pki, "node-a", "shard"), "heartbeat"))
    assert live.observe(signed, names.heartbeat_subject("node-a")) is not None
    assert live.observe(signed, names.heartbeat_subject("node-b")) is None  # on another node's subject
    assert live.observe(unsigned, names.heartbeat_subject("node-a")) is None
    assert live.observe(signed, names.heartbeat_subject("node-a")) is None  # the same one again
    assert rejections == ["untrusted", "unsigned", "replayed"]
    assert list(live.nodes) == ["node-a"]


def test_only_ack_subjects_of_the_requests_stream_count_as_held_requests() -> None:
    assert names.is_request_ack_subject(f"$JS.ACK.{names.REQUESTS_STREAM}.stage0-m.1.7.7.1700000000.0")
    assert names.is_request_ack_subject(f"$JS.ACK.hub.ACCHASH.{names.REQUESTS_STREAM}.stage0-m.1.7.7.1.0.x")
    assert not names.is_request_ack_subject(f"$JS.ACK.{names.TOKENS_STREAM}.c.1.2.3.4.5")
    assert not names.is_request_ack_subject("mohawk.v1.req.m")
    assert not names.is_request_ack_subject("$JS.API.STREAM.PURGE.MOHAWK_REQUESTS")
