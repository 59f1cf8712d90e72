"""A node that leaves the bus is known from nats-server's disconnect advisory, not after its
heartbeats lapse (`departures.py`): real nats-server in operator mode, a user per process, the
coordinator hearing the advisories as the events user; the heartbeat timeout is set far longer than
any wait here, so a plan without the node can only come from the advisory."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from mohawk_common.bus.connect import connect
from mohawk_common.bus.nats_auth import EVENTS_USER, NatsAuth, init_auth, issue_user
from mohawk_common.bus.nats_jwt import NKey, UserPermissions, user_jwt
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import ensure_buckets
from mohawk_coordinator.coordinator import Coordinator
from mohawk_coordinator.departures import (
    CONNECT,
    DISCONNECT,
    Advisory,
    DepartureWatch,
    hear_advisories,
    parse_advisory,
)
from mohawk_proto.v1 import bus_pb2
from tests.coordinator.fake_node import MODEL, FakeNode
from tests.coordinator.harness import Replica, settings, stage_ranges, wait_for_plan

HEARTBEAT_TTL_S = 30.0  # a plan without the node sooner than this came from the advisory


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def advisory(kind: str, user: str, client_id: int, reason: str = "", server: str = "S1") -> Advisory:
    return Advisory(kind, user, (server, client_id), reason)


def test_a_closed_connection_departs_once_its_grace_passes_without_a_reconnect() -> None:
    clock = Clock()
    watch = DepartureWatch(0.25, clock)
    watch.observe(advisory(CONNECT, "shard-1", 7))
    watch.observe(advisory(DISCONNECT, "shard-1", 7, "Client Closed"))
    clock.now = 0.2
    assert watch.due() == []
    clock.now = 0.3
    assert watch.due() == [("shard-1", "Client Closed")]
    assert watch.due() == []  # reported once


def test_a_reconnect_within_the_grace_another_open_connection_or_a_server_shutdown_is_no_departure() -> None:
    clock = Clock()
    watch = DepartureWatch(0.25, clock)
    watch.observe(advisory(DISCONNECT, "shard-1", 7, "Read Error"))
    watch.observe(advisory(CONNECT, "shard-1", 3, server="S2"))  # back, on another server
    watch.observe(advisory(CONNECT, "shard-2", 8))
    watch.observe(advisory(CONNECT, "shard-2", 9))
    watch.observe(advisory(DISCONNECT, "shard-2", 8, "Client Closed"))  # its other one is open
    watch.observe(advisory(DISCONNECT, "shard-3", 5, "Server Shutdown"))  # it reconnects elsewhere
    clock.now = 5.0
    assert watch.due() == []


def _event(event_type: str, token: str, **client: object) -> bytes:
    body = {"type": event_type, "server": {"id": "NSERVER"}, "client": {"id": 4, "jwt": token, **client}}
    return json.dumps({**body, "reason": "Client Closed"}).encode()


def test_an_advisory_names_the_process_its_user_jwt_was_issued_to_not_its_connection_name() -> None:
    account, user = NKey.create("account"), NKey.create("user")
    token = user_jwt(
        account, user.public_key, name="shard-1", permissions=UserPermissions((), ()), expires_at=None
    )
    found = parse_advisory(_event(DISCONNECT, token, name="shard-2", kind="Client"))
    assert found == Advisory(DISCONNECT, "shard-1", ("NSERVER", 4), "Client Closed")
    assert parse_advisory(_event(DISCONNECT, token, kind="Leafnode")) is None
    assert parse_advisory(_event("io.nats.server.advisory.v1.auth_error", token)) is None
    assert parse_advisory(_event(DISCONNECT, "not a jwt")) is None
    assert parse_advisory(b"{") is None


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[tuple[NatsServer, NatsAuth]]:
    auth = init_auth(tmp_path / "nats-auth")
    server = NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log", auth=auth).start()
    try:
        yield server, auth
    finally:
        server.stop()


async def _user(server: NatsServer, auth: NatsAuth, name: str, role: str) -> Client:
    creds = auth.creds(name)
    if not creds.is_file():
        issue_user(auth, name, role, creds, models=(MODEL,))
    return await connect(server.url, name=name, creds=creds)


async def _replica(server: NatsServer, auth: NatsAuth, **overrides: object) -> tuple[Replica, Client | None]:
    nc = await _user(server, auth, "coord-a", "coordinator")
    config = settings(
        server.url,
        "coord-a",
        node_ttl_s=HEARTBEAT_TTL_S,
        expected_nodes=2,
        events_creds=auth.creds(EVENTS_USER),
        **overrides,
    )
    coordinator = Coordinator(config, nc, await ensure_buckets(nc.jetstream(), config.bus_limits()))
    events = await hear_advisories(config, coordinator.heard)
    return Replica(coordinator, asyncio.create_task(coordinator.run()), nc), events


async def _planned_over_two(
    server: NatsServer, auth: NatsAuth, **overrides: object
) -> tuple[Replica, Client, list[FakeNode], bus_pb2.Plan]:
    """A coordinator hearing advisories, two nodes heartbeating on connections of their own users,
    and the plan over both."""
    replica, events = await _replica(server, auth, **overrides)
    assert events is not None
    conns = [await _user(server, auth, f"node-{i}", "shard") for i in range(2)]
    nodes = [await FakeNode(nc, f"node-{i}").start() for i, nc in enumerate(conns)]
    plan = await wait_for_plan(
        replica.coordinator.buckets, lambda p: len(p.stages) == 2, 10, "a plan over both nodes"
    )
    return replica, events, nodes, plan


async def _stop(replica: Replica, events: Client, nodes: list[FakeNode]) -> None:
    for node in nodes:
        await node.stop()
        await node.nc.close()
    await replica.stop()
    await events.close()


def test_a_node_whose_connection_closes_leaves_the_plan_at_once(
    auth_server: tuple[NatsServer, NatsAuth],
) -> None:
    server, auth = auth_server

    async def scenario() -> None:
        replica, events, nodes, _ = await _planned_over_two(server, auth)
        buckets = replica.coordinator.buckets
        await nodes[1].stop()
        closed = time.monotonic()
        await nodes[1].nc.close()  # the process exits: its socket closes, the server says so
        plan = await wait_for_plan(buckets, lambda p: len(p.stages) == 1, 5, "a plan without node-1")
        took = time.monotonic() - closed
        print(f"\nnode-1's connection closed: a plan without it {took:.3f} s later")
        assert stage_ranges(plan) == [("node-0", 0, 30)]
        assert took < 1.0, f"{took:.2f} s: not the advisory (heartbeats lapse after {HEARTBEAT_TTL_S} s)"
        await _stop(replica, events, nodes)

    asyncio.run(scenario())


def test_a_connection_that_comes_back_within_the_grace_does_not_re_plan(
    auth_server: tuple[NatsServer, NatsAuth],
) -> None:
    server, auth = auth_server

    async def scenario() -> None:
        replica, events, nodes, first = await _planned_over_two(server, auth, departure_grace_s=1.0)
        buckets = replica.coordinator.buckets
        await nodes[1].stop()
        await nodes[1].nc.close()  # a link that drops and comes back: the same process, a new connection
        nodes[1].nc = await _user(server, auth, "node-1", "shard")
        await nodes[1].start()
        await asyncio.sleep(2.5)
        assert (await wait_for_plan(buckets, lambda p: True, 1, "the plan")).version == first.version
        assert set(replica.coordinator.registry.live()) == {"node-0", "node-1"}
        await _stop(replica, events, nodes)

    asyncio.run(scenario())


def test_the_events_user_hears_connection_advisories_and_nothing_else(
    auth_server: tuple[NatsServer, NatsAuth],
) -> None:
    server, auth = auth_server

    async def scenario() -> None:
        events = await connect(server.url, name="events", creds=auth.creds(EVENTS_USER))
        ops = await _user(server, auth, "ops", "ops")  # may read heartbeats
        heard_by_events: list[str] = []
        heard_by_ops: list[str] = []

        async def to_events(msg: Msg) -> None:
            heard_by_events.append(msg.subject)

        async def to_ops(msg: Msg) -> None:
            heard_by_ops.append(msg.subject)

        await events.subscribe("mohawk.>", cb=to_events)  # refused by the server
        await ops.subscribe("mohawk.v1.hb.>", cb=to_ops)
        await events.flush()
        await ops.flush()
        node = await _user(server, auth, "node-0", "shard")
        await node.publish("mohawk.v1.hb.node-0", b"{}")
        await events.publish("mohawk.v1.hb.node-1", b"{}")  # refused: it may publish nothing
        await node.flush()
        await events.flush()
        await asyncio.sleep(0.3)
        assert heard_by_ops == ["mohawk.v1.hb.node-0"]
        assert heard_by_events == []
        for nc in (events, ops, node):
            await nc.close()

    asyncio.run(scenario())
