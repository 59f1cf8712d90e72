"""Signed control records: a plan verifies only as its leader coordinator's, a heartbeat only as its
node's, through the JSON they travel as; every other record is refused with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from mohawk_common.bus.control import decode_json, encode_json
from mohawk_common.bus.control_records import RecordVerifier, sign_record
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.pki_files import Bundle, init_pki, issue_node, load_bundle, revoke
from mohawk_proto.v1 import bus_pb2


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki")
    init_pki(path)
    for node_id, role in (("coord-a", "coordinator"), ("node-a", "shard"), ("gw-a", "gateway")):
        issue_node(path, node_id, role)
    return path


def bundle(pki: Path, node_id: str, role: str) -> Bundle:
    return load_bundle(pki / "nodes" / node_id, role=role)


def a_plan(leader: str = "coord-a") -> bus_pb2.Plan:
    plan = bus_pb2.Plan(version=7, model="m", num_layers=30, state="active", leader=leader, created=1.25)
    plan.stages.add(node_id="node-a", start=0, end=15, node_started_at_ms=1_700_000_000_123)
    plan.stages.add(node_id="node-b", start=15, end=30, node_started_at_ms=1_700_000_000_456)
    plan.pipelines.add(id=0, epoch=7, active=True, num_kv_blocks=100, max_model_len=4096)
    return plan


def a_heartbeat() -> bus_pb2.Heartbeat:
    heartbeat = bus_pb2.Heartbeat(
        node_id="node-a", role="shard", model="m", seconds_per_layer=0.000123456789, sent_at=1.7e9 + 0.1
    )
    heartbeat.security_rejections.update({"tampered": 2, "replayed": 1})
    heartbeat.held_requests.append("$JS.ACK.MOHAWK_REQUESTS.c.1.2.3.4.5")
    return heartbeat


def through_the_bus(record: bus_pb2.Plan | bus_pb2.Heartbeat) -> bus_pb2.Plan | bus_pb2.Heartbeat:
    return decode_json(type(record), encode_json(record))


def test_a_signed_plan_and_heartbeat_verify_after_their_json_round_trip(pki: Path) -> None:
    verifier = RecordVerifier(bundle(pki, "gw-a", "gateway").trust)
    plan = sign_record(a_plan(), bundle(pki, "coord-a", "coordinator").identity, "plan")
    heartbeat = sign_record(a_heartbeat(), bundle(pki, "node-a", "shard").identity, "heartbeat")
    verifier.verify(through_the_bus(plan), "plan")
    verifier.verify(through_the_bus(heartbeat), "heartbeat")
    verifier.verify(through_the_bus(heartbeat), "heartbeat")  # the cached signer still checks the signature


@pytest.mark.parametrize(
    ("signer", "role", "leader", "reason"),
    [
        ("node-a", "shard", "node-a", "untrusted"),  # a shard may not sign plans
        ("gw-a", "gateway", "gw-a", "untrusted"),  # nor a gateway
        ("coord-a", "coordinator", "coord-b", "untrusted"),  # a plan naming another leader
    ],
)
def test_a_plan_signed_by_anyone_but_its_leader_coordinator_is_refused(
    pki: Path, signer: str, role: str, leader: str, reason: str
) -> None:
    plan = sign_record(a_plan(leader), bundle(pki, signer, role).identity, "plan")
    with pytest.raises(AuthenticationError) as caught:
        RecordVerifier(bundle(pki, "gw-a", "gateway").trust).verify(through_the_bus(plan), "plan")
    assert caught.value.reason == reason


def test_unsigned_edited_and_relabelled_records_are_refused(pki: Path) -> None:
    verifier = RecordVerifier(bundle(pki, "gw-a", "gateway").trust)
    with pytest.raises(AuthenticationError) as caught:
        verifier.verify(a_plan(), "plan")
    assert caught.value.reason == "unsigned"
    plan = sign_record(a_plan(), bundle(pki, "coord-a", "coordinator").identity, "plan")
    edited = through_the_bus(plan)
    assert isinstance(edited, bus_pb2.Plan)
    edited.stages[0].end, edited.stages[1].start = 20, 20  # the forger moves a layer boundary
    with pytest.raises(AuthenticationError) as caught:
        verifier.verify(edited, "plan")
    assert caught.value.reason == "tampered"
    bumped = through_the_bus(plan)
    assert isinstance(bumped, bus_pb2.Plan)
    bumped.version += 1000
    with pytest.raises(AuthenticationError):
        verifier.verify(bumped, "plan")
    # a heartbeat's signature never passes for another kind of record
    heartbeat = sign_record(a_heartbeat(), bundle(pki, "node-a", "shard").identity, "heartbeat")
    heartbeat.held_requests.append("victim.subject")
    with pytest.raises(AuthenticationError) as caught:
        verifier.verify(heartbeat, "heartbeat")
    assert caught.value.reason == "tampered"


def test_a_revoked_signer_is_refused_once_the_list_arrives_even_if_cached(tmp_path: Path) -> None:
    init_pki(tmp_path)
    issue_node(tmp_path, "node-a", "shard")
    issue_node(tmp_path, "gw-a", "gateway")
    node = bundle(tmp_path, "node-a", "shard")
    verifier = RecordVerifier(bundle(tmp_path, "gw-a", "gateway").trust)
    heartbeat = sign_record(a_heartbeat(), node.identity, "heartbeat")
    verifier.verify(heartbeat, "heartbeat")
    assert verifier.trust is not None
    verifier.trust.update_revocations(revoke(tmp_path, [node.identity.body.serial]))
    with pytest.raises(AuthenticationError) as caught:
        verifier.verify(heartbeat, "heartbeat")
    assert caught.value.reason == "revoked"


def test_an_insecure_reader_has_no_root_and_checks_nothing() -> None:
    RecordVerifier(None).verify(a_plan(), "plan")
