"""Leader election against a real nats-server: one leader, failover after a crash, handover, fencing."""

from __future__ import annotations

import asyncio

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import BusLimits, ensure_buckets
from mohawk_coordinator.election import LeaderElection
from mohawk_coordinator.publisher import PlanConflictError, PlanStore
from mohawk_proto.v1 import bus_pb2
from tests.coordinator.fake_node import FakeNode
from tests.coordinator.harness import TTL_S, start_replica, wait_for, wait_for_plan

POLL_S = TTL_S / 10


def test_one_leader_and_failover_within_one_ttl_after_a_crash(nats_server: NatsServer) -> None:
    async def scenario() -> float:
        a = await start_replica(nats_server.url, "coord-a")
        b = await start_replica(nats_server.url, "coord-b")
        replicas = [a, b]
        await wait_for(lambda: any(r.coordinator.is_leader for r in replicas), TTL_S + 1, "a leader")
        for _ in range(50):  # 0.5 s: never two leaders
            assert sum(r.coordinator.is_leader for r in replicas) == 1
            await asyncio.sleep(0.01)
        leader, standby = (a, b) if a.coordinator.is_leader else (b, a)
        await leader.crash()
        failover = await wait_for(lambda: standby.coordinator.is_leader, 3 * TTL_S, "failover")
        await standby.stop()
        return failover

    failover = asyncio.run(scenario())
    print(f"failover after a crash: {failover:.3f} s (lease ttl {TTL_S} s, poll {POLL_S:.2f} s)")
    assert failover <= TTL_S + POLL_S + 0.25  # bound: ttl + one poll after the last renewal


def test_graceful_stop_hands_over_within_a_poll(nats_server: NatsServer) -> None:
    async def scenario() -> float:
        a = await start_replica(nats_server.url, "coord-a")
        await wait_for(lambda: a.coordinator.is_leader, TTL_S + 1, "a to lead")
        b = await start_replica(nats_server.url, "coord-b")
        await asyncio.sleep(0.3)
        assert not b.coordinator.is_leader
        await a.stop()
        handover = await wait_for(lambda: b.coordinator.is_leader, TTL_S, "handover")
        await b.stop()
        return handover

    handover = asyncio.run(scenario())
    print(f"handover after a graceful stop: {handover:.3f} s")
    assert handover <= 2 * POLL_S + 0.2


def test_renewal_after_the_lease_was_taken_steps_down(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        nc = await connect(nats_server.url, name="test")
        buckets = await ensure_buckets(nc.jetstream(), BusLimits(lease_ttl_s=TTL_S))
        changes: list[bool] = []
        election = LeaderElection(buckets.leader, "a", TTL_S, on_change=changes.append)
        assert await election.campaign()
        assert await election.renew() and election.is_leader
        other = LeaderElection(buckets.leader, "b", TTL_S)
        assert not await other.campaign()  # held and fresh
        entry = await buckets.leader.get(names.LEADER_KEY)
        await buckets.leader.update(names.LEADER_KEY, b"intruder", last=entry.revision)
        assert not await election.renew()
        assert not election.is_leader and changes == [True, False]
        await nc.close()

    asyncio.run(scenario())


def test_plan_writes_are_compare_and_set(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        nc = await connect(nats_server.url, name="test")
        buckets = await ensure_buckets(nc.jetstream())
        first, second = PlanStore(buckets.plan), PlanStore(buckets.plan)
        read_a, read_b = await first.read(), await second.read()
        assert read_a.plan is None and read_a.revision == 0 and read_a.version == 0
        await first.write(bus_pb2.Plan(version=1, leader="a"), read_a.revision)
        try:
            await second.write(bus_pb2.Plan(version=1, leader="b"), read_b.revision)
            raise AssertionError("two writers wrote over the same revision")
        except PlanConflictError:
            pass
        stored = await second.read()
        assert stored.plan is not None and stored.plan.leader == "a"
        await buckets.plan.delete(names.PLAN_KEY)
        assert (await second.read()).version == 1  # monotonic even across a deleted key
        await nc.close()

    asyncio.run(scenario())


def test_a_deposed_leader_never_writes_a_plan(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        a = await start_replica(nats_server.url, "coord-a")
        buckets = a.coordinator.buckets
        nodes = [await FakeNode(a.nc, f"node-{i}").start() for i in range(2)]
        await wait_for_plan(buckets, lambda p: p.version == 1, 5, "version 1")
        # a replica elsewhere takes the lease over and publishes version 2 (as after a partition)
        lease = await buckets.leader.get(names.LEADER_KEY)
        await buckets.leader.update(names.LEADER_KEY, b"coord-z", last=lease.revision)
        store = PlanStore(buckets.plan)
        stored = await store.read()
        assert stored.plan is not None
        usurper = bus_pb2.Plan()
        usurper.CopyFrom(stored.plan)
        usurper.version, usurper.leader = 2, "coord-z"
        await store.write(usurper, stored.revision)
        nodes.append(await FakeNode(a.nc, "node-2").start())  # a would re-plan, if it still led
        await wait_for(lambda: not a.coordinator.is_leader, TTL_S, "a to step down")
        await asyncio.sleep(0.5)
        final = (await store.read()).plan
        assert final is not None and (final.version, final.leader) == (2, "coord-z")
        for node in nodes:
            await node.stop()
        await a.crash()

    asyncio.run(scenario())


def test_a_plan_written_by_someone_else_is_reread_and_versions_keep_growing(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        a = await start_replica(nats_server.url, "coord-a")
        buckets = a.coordinator.buckets
        nodes = [await FakeNode(a.nc, f"node-{i}").start() for i in range(2)]
        await wait_for_plan(buckets, lambda p: p.version == 1, 5, "version 1")
        store = PlanStore(buckets.plan)
        stored = await store.read()
        assert stored.plan is not None
        operator = bus_pb2.Plan()
        operator.CopyFrom(stored.plan)
        operator.version, operator.leader = 5, "operator"
        await store.write(operator, stored.revision)  # a's cached revision is stale now
        nodes.append(await FakeNode(a.nc, "node-2").start())
        plan = await wait_for_plan(
            buckets, lambda p: p.leader == "coord-a" and p.version > 5, 5, "a new plan"
        )
        assert plan.version == 6 and len(plan.stages) == 3
        assert a.coordinator.is_leader
        for node in nodes:
            await node.stop()
        await a.stop()

    asyncio.run(scenario())
