"""NATS users per process (`nats_auth`, `nats_permissions`), enforced by a real nats-server:
anonymous and foreign clients are refused, each process can do its job, and what it must not do
(speak for another process, write what is not its own) is refused by the server and so changes
nothing on the bus; a revoked user is dropped and refused."""

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
from mohawk_common.bus.nats_auth import NatsAuth, init_auth, issue_user
from mohawk_common.bus.nats_jwt import creds_jwt, decode_claims
from mohawk_common.bus.nats_permissions import ROLES, process_permissions
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import ensure_buckets, ensure_streams
from mohawk_common.bus.token_log import TokenLogReader
from mohawk_common.logging import redact_url
from mohawk_proto.v1 import engine_pb2

MODEL = "smollm2-135m-instruct"
OTHER_MODEL = "qwen2-0-5b"
WITHIN_S = 20.0  # what is allowed answers in milliseconds; this is room for a loaded machine
DENIED_WITHIN_S = 0.5  # a refused JetStream call gets no reply; the server says why on the side
# every process of the scenarios: name -> (role, model)
PROCESSES = {
    "coordinator-1": ("coordinator", None),
    "shard-1": ("shard", MODEL),
    "shard-2": ("shard", MODEL),
    "shard-x": ("shard", OTHER_MODEL),
    "gateway-1": ("gateway", None),
    "gateway-2": ("gateway", None),
    "telemetry": ("telemetry", None),
}


@pytest.fixture(scope="module")
def auth(tmp_path_factory: pytest.TempPathFactory) -> NatsAuth:
    auth = init_auth(tmp_path_factory.mktemp("nats-auth"))
    for name, (role, model) in PROCESSES.items():
        issue_user(
            auth,
            name,
            role,
            auth.creds(name),
            models=(model,) if model else (),
            serial=len(auth.users()) + 100,
        )
    return auth


@pytest.fixture(scope="module")
def server(auth: NatsAuth, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats"), auth=auth).start()
    yield server
    server.stop()


Bus = dict[str, Client]


@pytest.fixture
def on_bus(server: NatsServer, auth: NatsAuth) -> Callable[[Callable[[Bus], Awaitable[None]]], None]:
    """Run a scenario with one connection per process and tool user, the streams and buckets made by
    the coordinator."""

    def run(scenario: Callable[[Bus], Awaitable[None]]) -> None:
        async def main() -> None:
            clients = {
                name: await connect(server.url, name=name, attempts=1, creds=auth.creds(name))
                for name in (*PROCESSES, "ops", "admin")
            }
            try:
                js = clients["coordinator-1"].jetstream(timeout=WITHIN_S)
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


async def heard_nothing(queue: asyncio.Queue[Msg]) -> None:
    await asyncio.sleep(0.2)
    assert queue.empty(), [m.subject for m in queue._queue]  # type: ignore[attr-defined]


def test_init_writes_0600_files_and_keeps_the_keys(tmp_path: Path) -> None:
    first = init_auth(tmp_path)
    issue_user(first, "shard-1", "shard", first.creds("shard-1"), models=(MODEL,), serial=7)
    keys = {kind: first.key(kind).seed for kind in ("operator", "account", "system")}
    private = [first.conf, first.account_jwt, first.ledger, *(first.dir / "keys").iterdir()]
    for path in private + [first.creds(name) for name in ("ops", "admin", "system", "shard-1")]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    conf = first.conf.read_text()
    assert all(seed not in conf for seed in keys.values())  # public keys and JWTs only
    assert "operator:" in conf and "resolver_preload" in conf and "no_auth_user" not in conf
    again = init_auth(tmp_path)
    assert {kind: again.key(kind).seed for kind in keys} == keys
    assert [u["name"] for u in again.users()] == ["ops", "admin", "shard-1"]
    assert again.users()[-1]["serial"] == 7


def test_init_replaces_a_planted_link_and_a_leftover_mode(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    auth = NatsAuth(tmp_path / "auth")
    auth.creds("ops").parent.mkdir(parents=True)
    auth.creds("ops").symlink_to(elsewhere)  # dangling or not, it is not followed
    auth.conf.write_text("old")
    auth.conf.chmod(0o644)
    init_auth(auth.dir)
    assert elsewhere.read_text() == "untouched" and not auth.creds("ops").is_symlink()
    assert stat.S_IMODE(auth.conf.stat().st_mode) == 0o600


def test_each_user_names_only_its_own_subjects() -> None:
    plan_writes = f"$KV.{names.PLAN_BUCKET}.>"
    rules = {role: process_permissions(role, f"{role}-1", models=(MODEL,)) for role in ROLES}
    assert [role for role in ROLES if plan_writes in rules[role].publish] == ["coordinator"]
    for role in ROLES:
        assert not any(".PURGE." in s and "REQUESTS" in s for s in rules[role].publish), role
        assert not any(".DELETE." in s for s in rules[role].publish), role  # streams and watchers
    shard = rules["shard"]
    assert names.heartbeat_subject("shard-1") in shard.publish
    assert names.HEARTBEAT_WILDCARD not in shard.publish
    assert f"{names.PREFIX}.hs.*" not in shard.publish + shard.subscribe
    assert "_INBOX.>" not in shard.subscribe and "_INBOX.shard-1.>" in shard.subscribe
    assert not any(OTHER_MODEL in s for s in shard.publish)


def test_anonymous_and_foreign_clients_are_refused(server: NatsServer, tmp_path: Path) -> None:
    stranger = init_auth(tmp_path / "another-operator")  # same shape, not this server's operator
    issue_user(stranger, "shard-1", "shard", stranger.creds("shard-1"), models=(MODEL,))
    for creds in (None, stranger.creds("shard-1"), stranger.creds("ops")):
        with pytest.raises(ConnectionError, match=r"(?i)authorization violation"):
            asyncio.run(connect(server.url, name="intruder", attempts=1, creds=creds))


def test_credentials_come_from_mohawk_nats_creds(auth: NatsAuth, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOHAWK_NATS_CREDS", str(auth.creds("shard-1")))
    assert credential_options() == {
        "user_credentials": str(auth.creds("shard-1")),
        "inbox_prefix": "_INBOX.shard-1",
    }
    claims = decode_claims(creds_jwt(auth.creds("shard-1").read_text()))
    assert claims["name"] == "shard-1" and claims["nats"]["type"] == "user"
    monkeypatch.delenv("MOHAWK_NATS_CREDS")
    assert credential_options() == {}


def test_every_role_does_its_job(on_bus: Callable[[Callable[[Bus], Awaitable[None]]], None]) -> None:
    async def scenario(bus: Bus) -> None:
        coordinator, shard, gateway = bus["coordinator-1"], bus["shard-1"], bus["gateway-1"]
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
        for role in ("shard-1", "gateway-1", "telemetry"):
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
        await (await ensure_buckets(gw_js)).gateways.put(names.gateway_presence_key("gateway-1", "a1"), b"42")
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
        for role in ("gateway-1", "shard-2"):  # a stage 0 taking a request over reads its tokens back
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

        other = bus["shard-2"]
        await other.subscribe(names.handshakes_to("shard-2"), cb=answer)
        await server_has_all(other)
        assert (
            await shard.request(names.handshake_subject("shard-2", "shard-1"), b"offer", timeout=WITHIN_S)
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
            bus["shard-1"].jetstream(timeout=WITHIN_S),
        )
        await (await ensure_buckets(admin_js)).pki.put(names.CRL_KEY, b"crl 2")
        assert (await (await ensure_buckets(shard_js)).pki.get(names.CRL_KEY)).value == b"crl 2"
        store = await admin_js.create_object_store(names.SLICES_BUCKET)
        name = names.slice_object_name(MODEL, "shard-1")
        await store.put(name, b"package v1")
        await store.put(name, b"package v2")  # replacing purges the old chunks
        fetched = await (await shard_js.object_store(names.SLICES_BUCKET)).get(name)
        assert fetched.data == b"package v2"
        shard_store = (
            await bus["shard-1"].jetstream(timeout=DENIED_WITHIN_S).object_store(names.SLICES_BUCKET)
        )
        await refused(shard_store.put(name, b"forged"))
        gateway_pki = await bus["gateway-1"].jetstream(timeout=DENIED_WITHIN_S).key_value(names.PKI_BUCKET)
        await refused(gateway_pki.put(names.CRL_KEY, b"forged"))
        assert (await gateway_pki.get(names.CRL_KEY)).value == b"crl 2"

    on_bus(scenario)


def test_no_one_but_the_coordinator_writes_the_plan(
    on_bus: Callable[[Callable[[Bus], Awaitable[None]]], None],
) -> None:
    async def scenario(bus: Bus) -> None:
        plan = (await ensure_buckets(bus["coordinator-1"].jetstream(timeout=WITHIN_S))).plan
        revision = await plan.put(names.PLAN_KEY, b"the real plan")
        for role in ("shard-1", "gateway-1", "telemetry", "ops", "admin"):
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
        gateway_js = bus["gateway-1"].jetstream(timeout=DENIED_WITHIN_S)
        await gateway_js.publish(names.request_subject(MODEL), b"kept", headers={"Nats-Msg-Id": "kept"})
        streams = (names.REQUESTS_STREAM, names.TOKENS_STREAM, f"KV_{names.PLAN_BUCKET}")
        await refused(*(gateway_js.purge_stream(stream) for stream in streams))
        await refused(*(gateway_js.delete_stream(stream) for stream in streams))
        await refused(
            *(
                bus[role].jetstream(timeout=DENIED_WITHIN_S).purge_stream(names.REQUESTS_STREAM)
                for role in ("shard-1", "telemetry", "ops", "admin")
            )
        )
        info = await bus["coordinator-1"].jetstream(timeout=WITHIN_S).stream_info(names.REQUESTS_STREAM)
        assert info.state.messages >= 1

    on_bus(scenario)


def test_readers_cannot_publish_requests_or_forge_heartbeats(
    on_bus: Callable[[Callable[[Bus], Awaitable[None]]], None],
) -> None:
    async def scenario(bus: Bus) -> None:
        seen: asyncio.Queue[Msg] = asyncio.Queue()
        await bus["coordinator-1"].subscribe(names.HEARTBEAT_WILDCARD, cb=seen.put)
        await server_has_all(bus["coordinator-1"])
        before = (
            await bus["coordinator-1"].jetstream(timeout=WITHIN_S).stream_info(names.REQUESTS_STREAM)
        ).state.messages
        for role in ("telemetry", "ops", "admin"):
            js = bus[role].jetstream(timeout=DENIED_WITHIN_S)
            await refused(
                js.publish(names.request_subject(MODEL), b"x", headers={"Nats-Msg-Id": f"x-{role}"})
            )
            await bus[role].publish(names.heartbeat_subject("forged"), b"{}")
            await server_has_all(bus[role])
        await bus["gateway-1"].publish(names.heartbeat_subject("forged"), b"{}")
        await server_has_all(bus["gateway-1"])
        await asyncio.sleep(0.2)
        assert seen.empty()
        after = (
            await bus["coordinator-1"].jetstream(timeout=WITHIN_S).stream_info(names.REQUESTS_STREAM)
        ).state.messages
        assert after == before

    on_bus(scenario)


def test_a_node_cannot_speak_for_another_or_hear_what_is_its(
    on_bus: Callable[[Callable[[Bus], Awaitable[None]]], None],
) -> None:
    """With shard-1's credential: shard-2's heartbeat and telemetry, an offer as shard-2, offers to
    shard-2, shard-2's inbox and the frames into shard-2 are all refused; shard-2 hears none of it
    (a frame shard-1 sends it, as its previous stage does, arrives)."""

    async def scenario(bus: Bus) -> None:
        thief, victim = bus["shard-1"], bus["shard-2"]
        beats: asyncio.Queue[Msg] = asyncio.Queue()
        await bus["coordinator-1"].subscribe(names.HEARTBEAT_WILDCARD, cb=beats.put)
        reports: asyncio.Queue[Msg] = asyncio.Queue()
        await bus["telemetry"].subscribe(names.TELEMETRY_WILDCARD, cb=reports.put)
        offers: asyncio.Queue[Msg] = asyncio.Queue()
        await victim.subscribe(names.handshakes_to("shard-2"), cb=offers.put)
        stolen: asyncio.Queue[Msg] = asyncio.Queue()
        await thief.subscribe(names.handshakes_to("shard-2"), cb=stolen.put)  # refused by the server
        await thief.subscribe("_INBOX.shard-2.>", cb=stolen.put)  # refused too
        await thief.subscribe(names.activations_to("shard-2"), cb=stolen.put)  # and its frames
        frames: asyncio.Queue[Msg] = asyncio.Queue()
        await victim.subscribe(names.activations_to("shard-2"), cb=frames.put)
        for client in bus.values():
            await server_has_all(client)
        await thief.publish(names.heartbeat_subject("shard-2"), b"{}")
        await thief.publish(names.telemetry_subject("step", "shard-2"), b"{}")
        await thief.publish(names.handshake_subject("shard-x", "shard-2"), b"offer as shard-2")
        await bus["shard-x"].publish(names.handshake_subject("shard-2", "shard-x"), b"a real offer")
        await victim.publish("_INBOX.shard-2.reply", b"for shard-2 only")
        await thief.publish(names.activation_subject("shard-2", 1, 0, 1), b"a frame into shard-2")
        for client in (thief, victim, bus["shard-x"]):
            await server_has_all(client)
        assert (await asyncio.wait_for(offers.get(), WITHIN_S)).data == b"a real offer"
        assert (await asyncio.wait_for(frames.get(), WITHIN_S)).data == b"a frame into shard-2"
        for queue in (beats, reports, stolen, offers, frames):
            await heard_nothing(queue)

    on_bus(scenario)


def test_a_node_cannot_pull_another_models_requests(
    on_bus: Callable[[Callable[[Bus], Awaitable[None]]], None],
) -> None:
    async def scenario(bus: Bus) -> None:
        gw_js = bus["gateway-1"].jetstream(timeout=WITHIN_S)
        await gw_js.publish(names.request_subject(MODEL), b"for model", headers={"Nats-Msg-Id": "m1"})
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)
        foreign = bus["shard-x"].jetstream(timeout=DENIED_WITHIN_S)
        await refused(
            foreign.pull_subscribe(
                names.request_subject(MODEL),
                durable=names.stage0_consumer(MODEL),
                stream=names.REQUESTS_STREAM,
                config=config,
            ),
            foreign.pull_subscribe(
                names.request_subject(MODEL, 3),
                durable=names.stage0_consumer(MODEL, 3),
                stream=names.REQUESTS_STREAM,
                config=config,
            ),
        )
        own = bus["shard-x"].jetstream(timeout=WITHIN_S)
        await own.pull_subscribe(
            names.request_subject(OTHER_MODEL),
            durable=names.stage0_consumer(OTHER_MODEL, 3),
            stream=names.REQUESTS_STREAM,
            config=config,
        )

    on_bus(scenario)


def test_a_gateway_keeps_only_its_own_presence_and_no_one_deletes_a_watcher(
    on_bus: Callable[[Callable[[Bus], Awaitable[None]]], None],
) -> None:
    async def scenario(bus: Bus) -> None:
        mine = names.gateway_presence_key("gateway-1", "a1")
        kv = (await ensure_buckets(bus["gateway-1"].jetstream(timeout=WITHIN_S))).gateways
        revision = await kv.put(mine, b"alive")
        other = await bus["gateway-2"].jetstream(timeout=DENIED_WITHIN_S).key_value(names.GATEWAYS_BUCKET)
        await refused(other.delete(mine), other.purge(mine), other.put(mine, b"forged"))
        await other.put(names.gateway_presence_key("gateway-2", "b2"), b"its own")
        assert (await kv.get(mine)).revision == revision

        watcher = await kv.watch(mine)  # an ordered consumer on the bucket's stream
        stream = f"KV_{names.GATEWAYS_BUCKET}"
        [consumer] = [c.name for c in await bus["ops"].jsm().consumers_info(stream)]
        for name in ("gateway-2", "shard-1", "coordinator-1", "telemetry", "ops", "admin"):
            await refused(bus[name].jsm().delete_consumer(stream, consumer))
        assert [c.name for c in await bus["ops"].jsm().consumers_info(stream)] == [consumer]
        await watcher.stop()

    on_bus(scenario)


def test_a_revoked_user_is_dropped_and_refused(server: NatsServer, auth: NatsAuth, tmp_path: Path) -> None:
    """Revocation pushed as the system user: the connection closes within a second and the same
    credential is refused; a user issued after it (a new key) is not."""
    from mohawk_common.bus.nats_auth import push_account, revoke_users, users_named

    issue_user(auth, "shard-9", "shard", tmp_path / "shard-9.creds", models=(MODEL,))

    async def main() -> None:
        nc = await connect(server.url, name="shard-9", attempts=1, creds=tmp_path / "shard-9.creds")
        await server_has_all(nc)
        token = revoke_users(auth, users_named(auth, ["shard-9"]))
        started = asyncio.get_running_loop().time()
        await push_account([server.url], auth, token)
        async with asyncio.timeout(5):
            while nc.is_connected:
                await asyncio.sleep(0.01)
        assert asyncio.get_running_loop().time() - started < 1.0
        await nc.close()
        with pytest.raises(ConnectionError, match=r"(?i)authorization violation"):
            await connect(server.url, name="shard-9", attempts=1, creds=tmp_path / "shard-9.creds")
        issue_user(auth, "shard-9", "shard", tmp_path / "again.creds", models=(MODEL,))
        await (await connect(server.url, name="shard-9", attempts=1, creds=tmp_path / "again.creds")).close()

    first_key = users_named(auth, ["shard-9"])[0]
    asyncio.run(main())
    # kept for restarts: the saved account revokes the first key, and the include preloads it
    assert first_key in auth.revocations()
    assert json.dumps(auth.account_jwt.read_text().strip()) in auth.conf.read_text()


def test_urls_are_logged_without_their_password() -> None:
    text = "nats://mohawk-gateway:s3cret@10.0.0.1:4222,nats://tok3n@h2:4222,nats://plain:4222"
    shown = redact_url(text)
    assert "s3cret" not in shown and "tok3n" not in shown
    assert shown == "nats://mohawk-gateway:***@10.0.0.1:4222,nats://***@h2:4222,nats://plain:4222"
