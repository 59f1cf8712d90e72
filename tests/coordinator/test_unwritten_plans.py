"""A plan the leader could not write is planned again: when the plan stream times out the moment a
node leaves (its stream leader was on the host that went away, as in tests/multihost), the next
leader step writes a plan for the nodes that live now instead of keeping the dead node's plan
forever (real nats-server; the one failed write is the only thing injected)."""

from __future__ import annotations

import asyncio

import nats.errors

from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import NatsServer
from mohawk_proto.v1 import bus_pb2
from tests.coordinator.fake_node import FakeNode
from tests.coordinator.harness import start_replica, wait_for_plan


def test_a_plan_whose_write_timed_out_is_written_on_the_next_step(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        replica = await start_replica(nats_server.url, "coord-a")
        buckets = replica.coordinator.buckets
        nodes_nc = await connect(nats_server.url, name="nodes")
        nodes = [await FakeNode(nodes_nc, f"node-{i}").start() for i in range(3)]
        await wait_for_plan(buckets, lambda p: p.version == 1 and len(p.stages) == 3, 5, "version 1")

        store = replica.coordinator.store
        write, failed = store.write, []

        async def times_out_once(plan: bus_pb2.Plan, last_revision: int) -> int:
            if not failed:
                failed.append(plan.version)
                raise nats.errors.TimeoutError
            return await write(plan, last_revision)

        store.write = times_out_once  # type: ignore[method-assign]
        await nodes[2].stop()
        v2 = await wait_for_plan(buckets, lambda p: p.version == 2, 5, "a plan without node-2")
        assert failed == [2]
        assert {s.node_id for s in v2.stages} == {"node-0", "node-1"}
        await replica.stop()
        for node in nodes[:2]:
            await node.stop()
        await nodes_nc.close()

    asyncio.run(scenario())
