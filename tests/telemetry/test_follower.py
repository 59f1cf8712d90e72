"""The telemetry service, given the operator root, shows only signed plans and heartbeats: a forged
node or plan never reaches the dashboard (real nats-server)."""

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
