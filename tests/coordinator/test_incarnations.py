"""Plans belong to the runs of the nodes they place: a coordinator never adopts a stored plan from
an earlier run of the cluster, a restarted node gets a new plan, and a certified coordinator signs
every plan it writes and ignores heartbeats that do not verify (real nats-server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import encode_json
from mohawk_common.bus.control_records import RecordVerifier
from mohawk_common.bus.server import NatsServer
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle
from mohawk_proto.v1 import bus_pb2
from tests.coordinator.fake_node import FakeNode
from tests.coordinator.harness import (
    TTL_S,
    start_replica,
    start_secure_replica,
    wait_for,
    wait_for_plan,
)


@pytest.mark.slow  # over 5 s here: the inner loop leaves it to `make test`
def test_a_plan_of_an_earlier_run_is_never_adopted_and_a_restarted_node_is_replanned(
    nats_server: NatsServer,
) -> None:
    async def scenario() -> None:
        first = await start_replica(nats_server.url, "coord-a")
        buckets = first.coordinator.buckets
        nodes_nc = await connect(nats_server.url, name="nodes")
        n0, n1 = [await FakeNode(nodes_nc, f"node-{i}").start() for i in range(2)]
        v1 = await wait_for_plan(buckets, lambda p: p.version == 1, 5, "version 1")
        assert [s.node_started_at_ms for s in v1.stages] == [n0.started_at_ms, n1.started_at_ms]
        n0.report_loaded(1, 0)
        n1.report_loaded(1, 1)
        await wait_for_plan(buckets, lambda p: p.state == "active", 3, "v1 active")

        # the whole cluster stops and comes back with the same ids (`mohawk up` again)
        await first.crash()
        await n0.stop()
        await n1.stop()
        await asyncio.sleep(0.05)
        n0, n1 = [await FakeNode(nodes_nc, f"node-{i}").start() for i in range(2)]
        second = await start_replica(nats_server.url, "coord-b")
        buckets = second.coordinator.buckets
        v2 = await wait_for_plan(buckets, lambda p: p.version == 2, 3 * TTL_S + 3, "a plan for the new run")
        assert v2.state == "loading"
        assert [s.node_started_at_ms for s in v2.stages] == [n0.started_at_ms, n1.started_at_ms]

        # one node restarts under the same id: its pipeline is re-formed, not kept
        n0.report_loaded(2, 0)
        n1.report_loaded(2, 1)
        await wait_for_plan(buckets, lambda p: p.version == 2 and p.state == "active", 3, "v2 active")
        await n1.stop()
        n1 = await FakeNode(nodes_nc, "node-1").start()
        v3 = await wait_for_plan(buckets, lambda p: p.version == 3, 5, "a plan for the restarted node")
        assert v3.stages[1].node_started_at_ms == n1.started_at_ms
        assert v3.state == "loading" and v3.pipelines[0].epoch == 3
        await second.stop()
        await n0.stop()
        await n1.stop()
        await nodes_nc.close()

    asyncio.run(scenario())


def test_a_certified_coordinator_signs_its_plans_and_plans_only_signed_nodes(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    init_pki(tmp_path)
    issue_node(tmp_path, "coord-a", "coordinator")
    issue_node(tmp_path, "node-0", "shard")
    issue_node(tmp_path, "node-2", "shard")
    node_bundle = load_bundle(tmp_path / "nodes" / "node-0", role="shard")

    async def scenario() -> None:
        started = await start_secure_replica(nats_server.url, tmp_path, "coord-a")
        replica, security, buckets = started.replica, started.security, started.buckets
        nodes_nc = await connect(nats_server.url, name="nodes")
        signed = await FakeNode(nodes_nc, "node-0", identity=node_bundle.identity).start()
        unsigned = await FakeNode(nodes_nc, "node-1").start()  # no certificate: an impostor
        plan = await wait_for_plan(buckets, lambda p: p.version == 1, 5, "version 1")
        assert [s.node_id for s in plan.stages] == ["node-0"]
        RecordVerifier(node_bundle.trust).verify(plan, "plan")  # what every reader checks
        await wait_for(lambda: security.rejections["unsigned"] > 0, 2, "the impostor's heartbeats counted")

        # a forger overwrites the plan key; the leader's next write finds it, and writes its own
        # plan back before it re-plans for a joining node: numbered on from the versions signed,
        # since no reader follows an unsigned record (so no writer of the key can use them up)
        forged = bus_pb2.Plan()
        forged.CopyFrom(plan)
        forged.version += 1000
        forged.ClearField("signed")
        await buckets.plan.put(names.PLAN_KEY, encode_json(forged))
        joining = load_bundle(tmp_path / "nodes" / "node-2", role="shard").identity
        third = await FakeNode(nodes_nc, "node-2", identity=joining).start()
        after = await wait_for_plan(
            buckets, lambda p: p.signed.signature and len(p.stages) == 2, 5, "a signed plan of 2 stages"
        )
        assert after.version > plan.version
        RecordVerifier(node_bundle.trust).verify(after, "plan")
        assert after.version < forged.version
        assert security.rejections["unsigned"] > 0
        await third.stop()
        await replica.stop()
        await signed.stop()
        await unsigned.stop()
        await nodes_nc.close()

    asyncio.run(scenario())
