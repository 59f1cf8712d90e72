"""`expected_nodes` (set by `mohawk up` to the nodes it starts): a term's first plan is made as soon
as that many nodes are live, without waiting for the set to stay unchanged `plan_settle_s`; a node
joining after that first plan waits the settle time as before."""

from __future__ import annotations

import asyncio
import time

from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import read_plan
from mohawk_common.bus.server import NatsServer
from tests.coordinator.fake_node import FakeNode
from tests.coordinator.harness import TTL_S, stage_ranges, start_replica, wait_for, wait_for_plan

SETTLE_S = 30.0  # far longer than any wait below: a plan inside them did not wait for it


def test_the_first_plan_waits_for_nobody_once_the_expected_nodes_are_live(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        coordinator = await start_replica(
            nats_server.url, "coord-a", plan_settle_s=SETTLE_S, expected_nodes=2
        )
        await wait_for(lambda: coordinator.coordinator.is_leader, TTL_S + 1, "coord-a to lead")
        buckets = coordinator.coordinator.buckets
        nodes_nc = await connect(nats_server.url, name="nodes")
        first = await FakeNode(nodes_nc, "node-0").start()
        await asyncio.sleep(1.0)  # one node of the two: no plan yet
        assert await read_plan(buckets.plan) is None
        second = await FakeNode(nodes_nc, "node-1").start()
        started = time.monotonic()
        plan = await wait_for_plan(buckets, lambda p: p.version == 1, 5, "version 1")
        assert time.monotonic() - started < SETTLE_S / 3
        assert stage_ranges(plan) == [("node-0", 0, 15), ("node-1", 15, 30)]

        late = await FakeNode(nodes_nc, "node-2").start()  # past the first plan: the settle rule holds
        await asyncio.sleep(2.0)
        again = await wait_for_plan(buckets, lambda p: True, 1, "the plan")
        assert again.version == 1, "a node joining after the first plan re-planned without settling"
        for node in (first, second, late):
            await node.stop()
        await nodes_nc.close()
        await coordinator.stop()

    asyncio.run(scenario())
