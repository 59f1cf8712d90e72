"""NATS users per role (`nats_auth`), enforced by a real nats-server: anonymous clients are refused,
each role can do its job, and what a role must not do is refused by the server (and so changes
nothing on the bus)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import stat
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect, credential_options, server_has_all
from mohawk_common.bus.nats_auth import ROLES, NatsAuth, init_auth, role_permissions
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import ensure_buckets, ensure_streams
from mohawk_common.bus.token_log import TokenLogReader
from mohawk_common.logging import redact_url
from mohawk_proto.v1 import engine_pb2

MODEL = "smollm2-135m-instruct"
WITHIN_S = 20.0  # what is allowed answers in milliseconds; this is room for a loaded machine
DENIED_WITHIN_S = 0.5  # a refused JetStream call gets no reply; the server says why on the side


@pytest.fixture(scope="module")
def auth(tmp_path_factory: pytest.TempPathFactory) -> NatsAuth:
    return init_auth(tmp_path_factory.mktemp("nats-auth"))


@pytest.fixture(scope="module")
def server(auth: NatsAuth, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats"), auth=auth).start()
    yield server
    server.stop()


Bus = dict[str, Client]


@pytest.fixture
def on_bus(server: NatsServer, auth: NatsAuth) -> Callable[[Callable[[Bus], Awaitable[None]]], None]:
    """Run a scenario with one connection per role, the streams and buckets made by the coordinator."""

    def run(scenario: Callable[[Bus], Awaitable[None]]) -> None:
        async def main() -> None:
            clients = {
                role: await connect(server.url, name=role, attempts=1, creds=auth.creds(role))
                for role in ROLES
            }
            try:
                js = clients["coordinator"].jetstream(timeout=WITHIN_S)
                await ensure_streams(js)
                await ensure_buckets(js)
                await scenario(clients)
            finally:
                for client in clients.values():
                    await client.close()

        asyncio.run(main())

    return run


async def refused(*calls: Awaitable[object]) -> None:
    """The server refused every one of `calls`: none has a reply within DENIED_WITHIN_S."""

    async def one(call: Awaitable[object]) -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(call, DENIED_WITHIN_S)

    await asyncio.gather(*(one(call) for call in calls))


def test_init_writes_0600_files_and_keeps_the_credentials(tmp_path: Path) -> None:
    first = init_auth(tmp_path)
    passwords = {role: json.loads(first.creds(role).read_text())["password"] for role in ROLES}
    for path in [first.conf, *(first.creds(role) for role in ROLES)]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    conf = first.conf.read_text()
    assert all(password not in conf for password in passwords.values())  # only bcrypt hashes
    assert conf.count('password: "$2b$') == len(ROLES)
    assert "no_auth_user" not in conf
    again = init_auth(tmp_path)
    assert {role: json.loads(again.creds(role).read_text())["password"] for role in ROLES} == passwords


def test_init_replaces_a_planted_link_and_a_leftover_mode(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    auth = NatsAuth(tmp_path / "auth")
    auth.creds("ops").parent.mkdir(parents=True)
    auth.creds("shard").symlink_to(elsewhere)  # dangling or not, it is not followed
    auth.conf.write_text("old")
    auth.conf.chmod(0o644)
    init_auth(auth.dir)
    assert elsewhere.read_text() == "untouched" and not auth.creds("shard").is_symlink()
    assert stat.S_IMODE(auth.conf.stat().st_mode) == 0o600


def test_only_the_coordinator_may_write_the_plan() -> None:
    plan_writes = f"$KV.{names.PLAN_BUCKET}.>"
    writers = [role for role in ROLES if plan_writes in role_permissions(role).publish]
    assert writers == ["coordinator"]
    for role in ROLES:
        assert not any(".PURGE." in s and "REQUESTS" in s for s in role_permissions(role).publish), role
        assert not any(".DELETE." in s and ".STREAM." in s for s in role_permissions(role).publish), role


def test_anonymous_and_wrong_password_clients_are_refused(server: NatsServer, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.creds"
    wrong.write_text(json.dumps({"user": "mohawk-gateway", "password": "guess"}))
    for creds in (None, wrong):
        with pytest.raises(ConnectionError, match=r"(?i)authorization violation"):
            asyncio.run(connect(server.url, name="intruder", attempts=1, creds=creds))


def test_credentials_come_from_mohawk_nats_creds(auth: NatsAuth, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOHAWK_NATS_CREDS", str(auth.creds("shard")))
    assert credential_options()["user"] == "mohawk-shard"
    monkeypatch.delenv("MOHAWK_NATS_CREDS")
    assert credential_options() == {}


def test_every_role_does_its_job(on_bus: Callable[[Callable[[Bus], Awaitable[None]]], None]) -> None:
    async def scenario(bus: Bus) -> None:
        coordinator, shard, gateway = bus["coordinator"], bus["shard"], bus["gateway"]
        # The coordinator hears heartbeats and writes the lease and the plan.
        heartbeats: asyncio.Queue[Msg] = asyncio.Queue()
        await coordinator.subscribe(names.HEARTBEAT_WILDCARD, cb=heartbeats.put)
        telemetry_heard: asyncio.Queue[Msg] = asyncio.Queue()
        await bus["telemetry"].subscribe(names.HEARTBEAT_WILDCARD, cb=telemetry_heard.put)
        await server_has_all(coordinator)
        await server_has_all(bus["telemetry"])
        buckets = await ensure_buckets(coordinator.jetstream(timeout=WITHIN_S))
        await buckets.leader.put(names.LEADER_KEY, b"coordinator-1")
        revision = await buckets.plan.put(names.PLAN_KEY, b"plan v1")

        # Every other service adopts the bus at start (ensure_*), and reads the plan.
        for role in ("shard", "gateway", "telemetry"):
            js = bus[role].jetstream(timeout=WITHIN_S)
            if role != "telemetry":
                await ensure_streams(js)
            plan = (await ensure_buckets(js)).plan
            assert (await plan.get(names.PLAN_KEY)).value == b"plan v1"
            watcher = await plan.watch(names.PLAN_KEY)
            async with asyncio.timeout(WITHIN_S):
                entry = None
                while entry is None:  # nats-py may mark "no more history" (None) first
                    entry = await watcher.updates(WITHIN_S)
            assert entry.revision == revision
            await watcher.stop()

        # A shard's heartbeat reaches the coordinator and telemetry.
        await shard.publish(names.heartbeat_subject("shard-1"), b"{}")
        assert (await asyncio.wait_for(heartbeats.get(), WITHIN_S)).subject == names.heartbeat_subject(
            "shard-1"
        )
        assert (await asyncio.wait_for(telemetry_heard.get(), WITHIN_S)).data == b"{}"

        # The gateway keeps its presence, publishes a request; stage 0 pulls and acks it.
        gw_js, shard_js = gateway.jetstream(timeout=WITHIN_S), shard.jetstream(timeout=WITHIN_S)
        await (await ensure_buckets(gw_js)).gateways.put("gateway-1", b"42")
        ack = await gw_js.publish(names.request_subject(MODEL), b"request", headers={"Nats-Msg-Id": "r1"})
        assert ack.stream == names.REQUESTS_STREAM
        pull = await shard_js.pull_subscribe(
            names.request_subject(MODEL),
            durable=names.stage0_consumer(MODEL),
            stream=names.REQUESTS_STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT),
        )
        [msg] = await pull.fetch(1, timeout=WITHIN_S)
        assert msg.data == b"request"
        await msg.ack_sync()
        assert [i.name for i in await shard_js.consumers_info(names.REQUESTS_STREAM)] == [
            names.stage0_consumer(MODEL)
        ]

        # The last stage's tokens reach the gateway, live and from the stream.
        tokens: asyncio.Queue[Msg] = asyncio.Queue()
        await gateway.subscribe(names.token_subject("r1"), cb=tokens.put)
        await server_has_all(gateway)
        await shard.publish(names.token_subject("r1"), b"token 0")
        assert (await asyncio.wait_for(tokens.get(), WITHIN_S)).data == b"token 0"
        async with asyncio.timeout(WITHIN_S):
            while True:  # the stream stores a core publish a moment after subscribers get it
                with contextlib.suppress(NotFoundError):
                    last = await gw_js.get_last_msg(names.TOKENS_STREAM, names.token_subject("r1"))
                    break
                await asyncio.sleep(0.05)
        assert last.data == b"token 0"
        for role in ("gateway", "shard"):  # a stage 0 taking a request over reads its tokens back
            event = engine_pb2.TokenEvent(request_id="r1", index=0, token_id=7).SerializeToString()
            await shard.publish(names.token_subject("r1"), event)
            reader = TokenLogReader(bus[role].jetstream(timeout=WITHIN_S), "r1")
            async with asyncio.timeout(WITHIN_S):
                while not (events := await reader.read_new()):
                    await asyncio.sleep(0.05)
            assert events[-1].token_id == 7

        # Shards answer each other's handshakes (request/reply over inboxes).
        async def answer(msg: Msg) -> None:
            await msg.respond(b"finish")

        await shard.subscribe(names.handshake_subject("shard-2"), cb=answer)
        await server_has_all(shard)
        other = bus["shard"]
        assert (
            await other.request(names.handshake_subject("shard-2"), b"offer", timeout=WITHIN_S)
        ).data == b"finish"

        # ops reads everything, writes nothing.
        ops = bus["ops"]
        streams = {i.config.name for i in await ops.jsm().streams_info()}
        assert {names.REQUESTS_STREAM, names.TOKENS_STREAM, f"KV_{names.PLAN_BUCKET}"} <= streams
        ops_plan = await ops.jetstream(timeout=WITHIN_S).key_value(names.PLAN_BUCKET)
        assert (await ops_plan.get(names.PLAN_KEY)).value == b"plan v1"
        assert names.PLAN_KEY in await ops_plan.keys()

    on_bus(scenario)


def test_admin_publishes_the_crl_and_slices_that_shards_read(
    on_bus: Callable[[Callable[[Bus], Awaitable[None]]], None],
) -> None:
    async def scenario(bus: Bus) -> None:
        admin_js, shard_js = (
            bus["admin"].jetstream(timeout=WITHIN_S),
            bus["shard"].jetstream(timeout=WITHIN_S),
        )
        await (await ensure_buckets(admin_js)).pki.put(names.CRL_KEY, b"crl 2")
        assert (await (await ensure_buckets(shard_js)).pki.get(names.CRL_KEY)).value == b"crl 2"
        store = await admin_js.create_object_store(names.SLICES_BUCKET)
        name = names.slice_object_name(MODEL, "shard-1")
        await store.put(name, b"package v1")
        await store.put(name, b"package v2")  # replacing purges the old chunks
        fetched = await (await shard_js.object_store(names.SLICES_BUCKET)).get(name)
        assert fetched.data == b"package v2"
        shard_store = await bus["shard"].jetstream(timeout=DENIED_WITHIN_S).object_store(names.SLICES_BUCKET)
        await refused(shard_store.put(name, b"forged"))
        gateway_pki = await bus["gateway"].jetstream(timeout=DENIED_WITHIN_S).key_value(names.PKI_BUCKET)
        await refused(gateway_pki.put(names.CRL_KEY, b"forged"))
        assert (await gateway_pki.get(names.CRL_KEY)).value == b"crl 2"

    on_bus(scenario)


def test_no_one_but_the_coordinator_writes_the_plan(
    on_bus: Callable[[Callable[[Bus], Awaitable[None]]], None],
) -> None:
    async def scenario(bus: Bus) -> None:
        plan = (await ensure_buckets(bus["coordinator"].jetstream(timeout=WITHIN_S))).plan
        revision = await plan.put(names.PLAN_KEY, b"the real plan")
        for role in ("shard", "gateway", "telemetry", "ops", "admin"):
            kv = await bus[role].jetstream(timeout=DENIED_WITHIN_S).key_value(names.PLAN_BUCKET)
            await refused(
                kv.put(names.PLAN_KEY, b"forged"), kv.delete(names.PLAN_KEY), kv.purge(names.PLAN_KEY)
            )
        entry = await plan.get(names.PLAN_KEY)
        assert (entry.value, entry.revision) == (b"the real plan", revision)

    on_bus(scenario)


def test_gateway_cannot_purge_or_delete_streams(
    on_bus: Callable[[Callable[[Bus], Awaitable[None]]], None],
) -> None:
    async def scenario(bus: Bus) -> None:
        gateway_js = bus["gateway"].jetstream(timeout=DENIED_WITHIN_S)
        await gateway_js.publish(names.request_subject(MODEL), b"kept", headers={"Nats-Msg-Id": "kept"})
        streams = (names.REQUESTS_STREAM, names.TOKENS_STREAM, f"KV_{names.PLAN_BUCKET}")
        await refused(*(gateway_js.purge_stream(stream) for stream in streams))
        await refused(*(gateway_js.delete_stream(stream) for stream in streams))
        await refused(
            *(
                bus[role].jetstream(timeout=DENIED_WITHIN_S).purge_stream(names.REQUESTS_STREAM)
                for role in ("shard", "telemetry", "ops", "admin")
            )
        )
        info = await bus["coordinator"].jetstream(timeout=WITHIN_S).stream_info(names.REQUESTS_STREAM)
        assert info.state.messages >= 1

    on_bus(scenario)


def test_readers_cannot_publish_requests_or_forge_heartbeats(
    on_bus: Callable[[Callable[[Bus], Awaitable[None]]], None],
) -> None:
    async def scenario(bus: Bus) -> None:
        seen: asyncio.Queue[Msg] = asyncio.Queue()
        await bus["coordinator"].subscribe(names.HEARTBEAT_WILDCARD, cb=seen.put)
        await server_has_all(bus["coordinator"])
        before = (
            await bus["coordinator"].jetstream(timeout=WITHIN_S).stream_info(names.REQUESTS_STREAM)
        ).state.messages
        for role in ("telemetry", "ops", "admin"):
            js = bus[role].jetstream(timeout=DENIED_WITHIN_S)
            await refused(
                js.publish(names.request_subject(MODEL), b"x", headers={"Nats-Msg-Id": f"x-{role}"})
            )
            await bus[role].publish(names.heartbeat_subject("forged"), b"{}")
            await server_has_all(bus[role])
        await bus["gateway"].publish(names.heartbeat_subject("forged"), b"{}")
        await server_has_all(bus["gateway"])
        await asyncio.sleep(0.2)
        assert seen.empty()
        after = (
            await bus["coordinator"].jetstream(timeout=WITHIN_S).stream_info(names.REQUESTS_STREAM)
        ).state.messages
        assert after == before

    on_bus(scenario)


def test_urls_are_logged_without_their_password() -> None:
    text = "nats://mohawk-gateway:s3cret@10.0.0.1:4222,nats://tok3n@h2:4222,nats://plain:4222"
    shown = redact_url(text)
    assert "s3cret" not in shown and "tok3n" not in shown
    assert shown == "nats://mohawk-gateway:***@10.0.0.1:4222,nats://***@h2:4222,nats://plain:4222"
