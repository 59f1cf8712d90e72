"""The telemetry service, given the operator root, shows only signed plans, heartbeats and reports:
a forged node, plan or report never reaches the dashboard (real nats-server)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import encode_json
from mohawk_common.bus.control_records import sign_record
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import ensure_buckets
from mohawk_common.bus.telemetry_records import seal_report
from mohawk_common.telemetry import REQUESTS, STEP, RequestReport, RequestSample, StepReport
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle
from mohawk_proto.v1 import bus_pb2
from mohawk_telemetry.cluster_state import ClusterState
from mohawk_telemetry.exporter import Exporter
from mohawk_telemetry.follower import BusFollower


def test_only_signed_heartbeats_and_plans_reach_the_dashboard(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    init_pki(tmp_path)
    issue_node(tmp_path, "node-a", "shard")
    issue_node(tmp_path, "coord-a", "coordinator")
    node = load_bundle(tmp_path / "nodes" / "node-a", role="shard")
    coordinator = load_bundle(tmp_path / "nodes" / "coord-a", role="coordinator").identity

    async def scenario() -> None:
        state = ClusterState(node_ttl_s=5.0)
        follower = BusFollower([nats_server.url], state, Exporter(state), node.trust)
        await follower.start()
        nc = await connect(nats_server.url, name="test-writer")
        buckets = await ensure_buckets(nc.jetstream())
        deadline = time.monotonic() + 10
        while follower.nc is None or not follower.nc.is_connected:
            assert time.monotonic() < deadline, "telemetry did not connect"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # its subscriptions are made right after connecting
        forged = bus_pb2.Heartbeat(node_id="node-x", role="shard", model="m", loaded=True)
        signed = sign_record(
            bus_pb2.Heartbeat(node_id="node-a", role="shard", model="m", sequence=1, sent_at=time.time()),
            node.identity,
            "heartbeat",
        )
        unsigned_plan = bus_pb2.Plan(version=9, model="m", leader="coord-a", state="active")
        for _ in range(3):
            await nc.publish(names.heartbeat_subject("node-x"), encode_json(forged))
            await nc.publish(names.heartbeat_subject("node-a"), encode_json(signed))
        await buckets.plan.put(names.PLAN_KEY, encode_json(unsigned_plan))
        plan = sign_record(bus_pb2.Plan(version=3, model="m", leader="coord-a"), coordinator, "plan")
        await buckets.plan.put(names.PLAN_KEY, encode_json(plan))
        while "node-a" not in state.nodes or state.plan is None:
            assert time.monotonic() < deadline, "the signed records did not arrive"
            await asyncio.sleep(0.05)
        assert "node-x" not in state.nodes
        assert state.plan.version == 3
        assert follower.rejections["unsigned"] >= 4  # three heartbeats and the plan
        await nc.close()
        await follower.stop()

    asyncio.run(scenario())


def test_only_signed_reports_about_their_signer_reach_the_dashboard(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Step and request reports count only when signed by their sender's certificate, about that
    sender, on its subject: unsigned, another node's report signed by node-a, node-a's report on
    node-b's subject, and a gateway's report about another gateway are each refused and counted."""
    init_pki(tmp_path)
    issue_node(tmp_path, "node-a", "shard")
    issue_node(tmp_path, "gw-a", "gateway")
    node = load_bundle(tmp_path / "nodes" / "node-a", role="shard")
    gateway = load_bundle(tmp_path / "nodes" / "gw-a", role="gateway").identity

    def step(node_id: str) -> str:
        return StepReport(
            node_id=node_id, model="m", runtime="torch", device="cpu", window_s=1.0, emitted=5
        ).model_dump_json()

    def requests(instance: str) -> str:
        sample = RequestSample(model="m", tenant="ten_1234", ttft_s=0.1, tokens=3)
        return RequestReport(gateway=instance, requests=[sample]).model_dump_json()

    async def scenario() -> None:
        state = ClusterState(node_ttl_s=5.0)
        follower = BusFollower([nats_server.url], state, Exporter(state), node.trust)
        await follower.start()
        nc = await connect(nats_server.url, name="test-writer")
        deadline = time.monotonic() + 10
        while follower.nc is None or not follower.nc.is_connected:
            assert time.monotonic() < deadline, "telemetry did not connect"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        forged = [
            (names.telemetry_subject(STEP, "node-x"), seal_report(STEP, "node-x", step("node-x"), None)),
            (
                names.telemetry_subject(STEP, "node-a"),
                seal_report(STEP, "node-a", step("node-b"), node.identity),
            ),
            (
                names.telemetry_subject(STEP, "node-b"),
                seal_report(STEP, "node-a", step("node-a"), node.identity),
            ),
            (
                names.telemetry_subject(REQUESTS, "gw-a"),
                seal_report(REQUESTS, "gw-a", requests("gw-b.1"), gateway),
            ),
            (names.telemetry_subject(STEP, "node-a"), b'{"kind": "step", "body": 7}'),
        ]
        for subject, data in forged:
            await nc.publish(subject, data)
        await nc.publish(
            names.telemetry_subject(STEP, "node-a"),
            seal_report(STEP, "node-a", step("node-a"), node.identity),
        )
        await nc.publish(
            names.telemetry_subject(REQUESTS, "gw-a"),
            seal_report(REQUESTS, "gw-a", requests("gw-a.1"), gateway),
        )
        while "node-a" not in state.nodes or not state.latencies:
            assert time.monotonic() < deadline, "the signed reports did not arrive"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert set(state.nodes) == {"node-a"} and len(state.latencies) == 1
        assert follower.rejections["unsigned"] == 1 and follower.rejections["untrusted"] == 3
        assert follower.rejections["malformed"] == 1
        await nc.close()
        await follower.stop()

    asyncio.run(scenario())
