"""Plans against a real nats-server: versions on join/leave, activation, failover, explain."""

from __future__ import annotations

import argparse
import asyncio

import pytest
from nats.js.errors import NoKeysError

from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import NatsServer, free_port
from mohawk_coordinator import explain
from mohawk_proto.v1 import bus_pb2
from tests.coordinator.fake_node import FakeNode
from tests.coordinator.harness import (
    TTL_S,
    Replica,
    stage_ranges,
    start_replica,
    wait_for,
    wait_for_plan,
)


def explain_args(url: str, *flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    explain.add_arguments(parser)
    return parser.parse_args(["--nats-url", url, *flags])


async def live_keys(replica: Replica) -> set[str]:
    try:
        return set(await replica.coordinator.buckets.nodes.keys())
    except NoKeysError:
        return set()


@pytest.mark.slow  # over 5 s here: the inner loop leaves it to `make test`
def test_plans_follow_membership_and_activate_when_loaded(
    nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    async def scenario() -> None:
        a = await start_replica(nats_server.url, "coord-a")
        await wait_for(lambda: a.coordinator.is_leader, TTL_S + 1, "coord-a to lead")
        b = await start_replica(nats_server.url, "coord-b")
        buckets = b.coordinator.buckets
        nodes_nc = await connect(nats_server.url, name="nodes")
        n0, n1 = [await FakeNode(nodes_nc, f"node-{i}").start() for i in range(2)]

        v1 = await wait_for_plan(buckets, lambda p: p.version == 1, 5, "version 1")
        assert stage_ranges(v1) == [("node-0", 0, 15), ("node-1", 15, 30)]
        assert (v1.state, v1.leader, v1.model, v1.num_layers, v1.block_size) == (
            "loading",
            "coord-a",
            "smollm2-135m-instruct",
            30,
            16,
        )
        # 256 MiB of KV over 15 layers of 24 KiB blocks; the model's 8192 positions cap the context
        assert v1.num_kv_blocks == (256 << 20) // (15 * 16 * 1536)
        assert v1.max_model_len == 8192
        assert any("spread" in reason for reason in v1.reasons)
        await wait_for_nodes(a, {"node-0", "node-1"})

        n0.report_loaded(1, 0)
        n1.report_loaded(0, -1)
        await asyncio.sleep(0.5)
        assert (await wait_for_plan(buckets, lambda p: True, 1, "v1")).state == "loading"
        n1.report_loaded(1, 1)
        active = await wait_for_plan(buckets, lambda p: p.state == "active", 3, "v1 active")
        assert active.version == 1 and stage_ranges(active) == stage_ranges(v1)

        text = await asyncio.to_thread(explain_text, nats_server.url, capsys)
        assert "plan version 1 (active)" in text and "coord-a" in text
        assert "node-0" in text and "[0, 15)" in text and "node-1" in text and "[15, 30)" in text
        assert "reasons:" in text and "KV blocks" in text
        assert "weights MiB" in text and "fp32" in text
        assert text.count("310.5") == 2  # 15 × 13.5 MiB + the 108 MiB embedding (stage 0) or head

        n2 = await FakeNode(nodes_nc, "node-2").start()
        v2 = await wait_for_plan(buckets, lambda p: p.version == 2, 5, "version 2")
        assert stage_ranges(v2) == [("node-0", 0, 10), ("node-1", 10, 20), ("node-2", 20, 30)]
        assert v2.state == "loading"

        await n1.stop()
        v3 = await wait_for_plan(buckets, lambda p: p.version == 3, 5, "version 3")
        assert stage_ranges(v3) == [("node-0", 0, 15), ("node-2", 15, 30)]
        await wait_for_nodes(a, {"node-0", "node-2"})
        n0.report_loaded(3, 0)
        n2.report_loaded(3, 1)
        await wait_for_plan(buckets, lambda p: p.state == "active", 3, "v3 active")

        await a.crash()  # the standby adopts the active plan: no new version, nothing to reload
        await wait_for(lambda: b.coordinator.is_leader, 3 * TTL_S, "coord-b to lead")
        await asyncio.sleep(0.5)
        adopted = await wait_for_plan(buckets, lambda p: True, 1, "the plan")
        assert (adopted.version, adopted.state, adopted.leader) == (3, "active", "coord-a")

        await n0.stop()
        v4 = await wait_for_plan(buckets, lambda p: p.version == 4, 5, "version 4")
        assert (stage_ranges(v4), v4.leader) == ([("node-2", 0, 30)], "coord-b")
        await n2.stop()  # no live nodes: the last plan stays
        await wait_for_nodes(b, set())
        await asyncio.sleep(0.3)
        kept = await wait_for_plan(buckets, lambda p: True, 1, "the plan")
        assert kept.version == 4
        await b.stop()
        await nodes_nc.close()

    asyncio.run(scenario())


async def wait_for_nodes(replica: Replica, expected: set[str], timeout: float = 3) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (keys := await live_keys(replica)) != expected:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"mohawk_nodes holds {keys}, expected {expected}")
        await asyncio.sleep(0.05)


def explain_text(url: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert explain.run(explain_args(url, "--explain")) == 0
    return capsys.readouterr().out


def test_plan_without_explain_prints_the_json(
    nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    async def scenario() -> None:
        a = await start_replica(nats_server.url, "coord-a")
        node = await FakeNode(a.nc, "solo").start()
        await wait_for_plan(a.coordinator.buckets, lambda p: p.version == 1, 5, "version 1")
        await node.stop()
        await a.stop()

    asyncio.run(scenario())
    capsys.readouterr()
    assert explain.run(explain_args(nats_server.url)) == 0
    out = capsys.readouterr().out
    assert '"version": "1"' in out and '"node_id": "solo"' in out


def test_plan_fails_in_one_line_when_nats_is_unreachable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(explain, "CONNECT_DEADLINE_S", 1.0)
    code = explain.run(explain_args(f"nats://127.0.0.1:{free_port()}", "--explain"))
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and "cannot reach NATS" in err


def test_plan_says_when_there_is_no_plan(nats_server: NatsServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert explain.run(explain_args(nats_server.url)) == 1
    assert "no plan has been published" in capsys.readouterr().err


def test_heartbeats_of_another_model_are_not_planned(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        a = await start_replica(nats_server.url, "coord-a")
        other = await FakeNode(a.nc, "other", model="qwen3-0.6b").start()
        mine = await FakeNode(a.nc, "mine").start()
        plan = await wait_for_plan(a.coordinator.buckets, lambda p: p.version == 1, 5, "version 1")
        assert [s.node_id for s in plan.stages] == ["mine"]
        assert isinstance(plan, bus_pb2.Plan)
        await other.stop()
        await mine.stop()
        await a.stop()

    asyncio.run(scenario())
