"""Quarantine: a node whose steps keep failing leaves the plan for a cool-down, then rejoins.

The policy on its own clock, then a leader against a real nats-server with `FakeNode` heartbeats
(which report `failed_steps` as a shard node does)."""

from __future__ import annotations

import asyncio

import pytest

from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import NatsServer
from mohawk_coordinator.quarantine import Quarantine
from mohawk_proto.v1 import bus_pb2
from tests.coordinator.fake_node import FakeNode
from tests.coordinator.harness import TTL_S, stage_ranges, start_replica, wait_for, wait_for_plan
from tests.coordinator.test_plans import explain_text


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def beat(node_id: str, failed: int, started_at_ms: int = 1) -> bus_pb2.Heartbeat:
    return bus_pb2.Heartbeat(node_id=node_id, failed_steps=failed, started_at_ms=started_at_ms)


def test_failures_within_the_window_quarantine_until_the_cool_down_ends() -> None:
    clock = Clock()
    quarantine = Quarantine(clock, threshold=3, window_s=60, cool_down_s=120)
    quarantine.observe(beat("a", 5))  # failures before the coordinator first heard it: not counted
    quarantine.observe(beat("b", 0))
    clock.now = 10.0
    quarantine.observe(beat("a", 7))
    assert quarantine.excluded({"a", "b"}) == set()
    clock.now = 100.0  # the first two are out of the window now
    quarantine.observe(beat("a", 8))
    assert quarantine.excluded({"a", "b"}) == set()
    clock.now = 110.0
    quarantine.observe(beat("a", 10))
    assert quarantine.excluded({"a", "b"}) == {"a"}
    clock.now = 200.0
    quarantine.observe(beat("a", 1, started_at_ms=2))  # restarted: still out until the cool-down ends
    assert quarantine.excluded({"a", "b"}) == {"a"}
    clock.now = 231.0
    assert quarantine.excluded({"a", "b"}) == set()
    quarantine.observe(beat("a", 2, started_at_ms=2))  # a fresh count: one more failure is not enough
    assert quarantine.excluded({"a", "b"}) == set()


def test_the_last_live_node_is_never_quarantined() -> None:
    clock = Clock()
    quarantine = Quarantine(clock, threshold=1)
    quarantine.observe(beat("only", 0))
    quarantine.observe(beat("only", 4))
    assert quarantine.excluded({"only"}) == set()


@pytest.mark.slow  # over 5 s here: the inner loop leaves it to `make test`
@pytest.mark.timeout(60)
def test_a_failing_node_leaves_the_plan_and_comes_back(
    nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    async def scenario() -> None:
        leader = await start_replica(
            nats_server.url, "coord-q", quarantine_failures=2, quarantine_window_s=30, quarantine_s=3
        )
        await wait_for(lambda: leader.coordinator.is_leader, TTL_S + 1, "coord-q to lead")
        buckets = leader.coordinator.buckets
        nc = await connect(nats_server.url, name="nodes")
        nodes = [await FakeNode(nc, f"node-{i}").start() for i in range(3)]
        v1 = await wait_for_plan(buckets, lambda p: len(p.stages) == 3, 5, "a 3-stage plan")
        nodes[1].heartbeat.failed_steps = 2  # two steps failed on node-1
        v2 = await wait_for_plan(buckets, lambda p: p.version > v1.version, 5, "a plan without node-1")
        assert [s for s, _, _ in stage_ranges(v2)] == ["node-0", "node-2"]
        assert list(v2.quarantined) == ["node-1"]
        text = await asyncio.to_thread(explain_text, nats_server.url, capsys)
        assert "quarantined (steps kept failing; 2 failed so far): node-1" in text
        v3 = await wait_for_plan(buckets, lambda p: p.version > v2.version, 10, "node-1 back")
        assert len(v3.stages) == 3 and not v3.quarantined
        for node in nodes:
            await node.stop()
        await nc.close()
        await leader.stop()

    asyncio.run(scenario())
