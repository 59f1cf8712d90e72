"""Hosts tested as hosts: a Mohawk cluster over three network namespaces on one bridge (conftest's
LAYOUT: host a runs the gateway, coordinator-1 and shard-1; host b coordinator-2 and shard-2; host
c shard-3; each host its own nats-server of a 3-server JetStream cluster, R3 streams and buckets,
NATS users per role). The test's HTTP clients run in a user's namespace and the attacker in a
namespace of its own, both on the bridge: every byte crosses a veth pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from mohawk_common.bus import names
from mohawk_common.bus.connect import TLS_CA_ENV
from mohawk_common.bus.control import decode_json
from mohawk_common.bus.pipelines import pipelines
from mohawk_pqc.pki_files import load_bundle
from mohawk_proto.v1 import bus_pb2
from tests.integration.cluster_helpers import PROMPTS
from tests.multihost.hosts import MultiHostCluster
from tests.multihost.netns import Lab, wait_for
from tests.multihost.probes import (
    Progress,
    Streamed,
    connect_as,
    heartbeats,
    in_ns,
    plan_history,
    read_plan_record,
    start_in_ns,
    stream_many,
)

# 2 to 6 minutes on a 2-core machine, a minute or more of it the cluster starting: `make multihost` runs it
pytestmark = pytest.mark.slow

MAX_TOKENS = 32
NUM_STREAMS = 16
STREAMS_BOUND_S = 240.0  # 16 streams through an unplugged host and back
DROPPED_WITHIN_S = 5.0  # a revoked node's connection, on every server
DENIED_WITHIN_S = 1.0  # a refused JetStream call gets no reply; the server says why on the side
SHARDS = {"shard-1", "shard-2", "shard-3"}


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """Greedy texts of PROMPTS from one process (the single-process torch engine, same weights)."""
    from mohawk_common.chat import encode_chat
    from mohawk_shard.config import EngineSettings
    from mohawk_shard.engine.sampling_params import SamplingParams
    from mohawk_shard.local import build_local_engine

    engine = build_local_engine(EngineSettings.model_validate({"num_threads": 1}))
    prompts = [encode_chat(engine.tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    params = SamplingParams.create(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    done = engine.generate(prompts, params)
    return {p: c.text for p, c in zip(PROMPTS, done, strict=True)}


def on_bus(
    cluster: MultiHostCluster, netns: str, role: str, fn: Callable[[Client], Awaitable[object]]
) -> object:
    """`fn(client)` with a connection as NATS role `role`, from namespace `netns`."""

    async def run() -> object:
        nc, _ = await connect_as(
            cluster.nats_urls(), cluster.creds(role), name=f"test-{role}", tls_ca=cluster.tls_ca.cert
        )
        try:
            return await fn(nc)
        finally:
            await nc.close()

    return in_ns(netns, run, 30)


def current_plan(
    cluster: MultiHostCluster, netns: str, servers: list[str] | None = None
) -> bus_pb2.Plan | None:
    """The plan key's record, read as the ops role; None when there is none or the bus does not
    answer now (a replicated bucket whose leader was on an unplugged host answers again once its
    remaining replicas elect one)."""

    async def run() -> bus_pb2.Plan | None:
        try:
            nc, _ = await connect_as(
                servers or cluster.nats_urls(),
                cluster.creds("ops"),
                name="test-ops",
                tls_ca=cluster.tls_ca.cert,
            )
        except ConnectionError:
            return None
        try:
            record = await read_plan_record(nc)
            return None if record is None else record[1]
        except (TimeoutError, NatsError):
            return None
        finally:
            await nc.close()

    return in_ns(netns, run, 30)


def served_by(plan: bus_pb2.Plan | None) -> set[str]:
    """The nodes of the plan's active pipelines."""
    if plan is None:
        return set()
    return {s.node_id for p in pipelines(plan) if p.active for s in p.stages}


def ask(cluster: MultiHostCluster, prompts: list[str]) -> list[Streamed]:
    """Greedy streams of `prompts`, from the user's namespace."""
    user = cluster.lab.host("user").netns
    return in_ns(user, lambda: stream_many(cluster.gateway_url, prompts, MAX_TOKENS), 120)


def assert_complete(results: list[Streamed], reference: dict[str, str]) -> None:
    """Every stream finished with exactly MAX_TOKENS tokens, each once, and the single process's text."""
    failed = [
        r
        for r in results
        if r.error is not None
        or r.finish_reason != "length"
        or not r.num_tokens == MAX_TOKENS == r.completion_tokens
        or r.text != reference[r.prompt]
    ]
    assert not failed, f"{len(failed)} of {len(results)} streams: " + "\n".join(map(str, failed))


def test_serves_across_hosts(cluster: MultiHostCluster, reference: dict[str, str]) -> None:
    user = cluster.lab.host("user").netns
    plan = current_plan(cluster, user)
    assert served_by(plan) == SHARDS, plan  # spread placement: one stage on each host
    assert {cluster.host_of(n) for n in served_by(plan)} == {"a", "b", "c"}
    assert_complete(ask(cluster, PROMPTS[:2]), reference)


def test_a_host_unplugged_under_16_streams_loses_no_request(
    cluster: MultiHostCluster, lab: Lab, reference: dict[str, str]
) -> None:
    """Host b (coordinator-2, shard-2, nats-b) loses its link while 16 greedy streams run, and gets
    it back once the cluster serves without it: every stream finishes, every token exactly once."""
    user = lab.host("user").netns
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(NUM_STREAMS)]
    progress = Progress(NUM_STREAMS)
    started = time.monotonic()
    streams = start_in_ns(
        user, lambda: stream_many(cluster.gateway_url, prompts, MAX_TOKENS, progress), STREAMS_BOUND_S
    )
    wait_for(lambda: min(progress.snapshot()) > 0, 120, "all 16 streams are generating")
    lab.set_link("b", up=False)
    unplugged = time.monotonic()
    reachable = [cluster.nats_url("a"), cluster.nats_url("c")]
    try:
        wait_for(
            lambda: served_by(current_plan(cluster, user, reachable)) == {"shard-1", "shard-3"},
            60,
            "a plan without host b's node is active",
        )
        flowing = sum(progress.snapshot())
        wait_for(lambda: sum(progress.snapshot()) > flowing, 60, "tokens flow without host b")
        served_alone_s = time.monotonic() - unplugged
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{cluster.diagnosis()}") from exc
    finally:
        lab.set_link("b", up=True)
    results = streams.result(STREAMS_BOUND_S)
    total_s = time.monotonic() - started
    assert len(results) == NUM_STREAMS
    assert_complete(results, reference)
    print(
        f"\nunplugged host b: served without it after {served_alone_s:.1f} s; 16 streams took {total_s:.1f} s"
    )


@contextlib.asynccontextmanager
async def step(what: str, timeout_s: float = 20.0) -> AsyncIterator[None]:
    """A bounded step of a scenario; a TimeoutError names it."""
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError as exc:
        raise TimeoutError(f"{what}: not within {timeout_s:.0f} s") from exc


def plan_order(plan: bus_pb2.Plan) -> tuple[int, int]:
    return plan.version, sum(1 for p in pipelines(plan) if p.active)


async def _refused(call: Awaitable[object]) -> bool:
    try:
        await asyncio.wait_for(call, DENIED_WITHIN_S)
    except TimeoutError:
        return True
    return False


def test_an_attacker_on_the_network(cluster: MultiHostCluster, lab: Lab, reference: dict[str, str]) -> None:
    attacker = lab.host("attacker").netns
    servers = cluster.nats_urls()
    # after the unplugged-host scenario the leader may keep a 2-node plan: any active one will do
    wait_for(
        lambda: bool(served_by(current_plan(cluster, lab.host("user").netns))),
        120,
        "a plan is active",
        poll_s=1.0,
    )

    # no credentials: every server refuses the connection
    async def anonymous(url: str) -> str:
        try:
            nc, _ = await connect_as([url], None, name="attacker", tls_ca=cluster.tls_ca.cert)
        except Exception as exc:
            return str(exc) or type(exc).__name__
        await nc.close()
        return "connected"

    for url in servers:
        refusal = in_ns(attacker, lambda url=url: anonymous(url), 30)  # type: ignore[misc]
        assert "authorization" in refusal.lower(), (url, refusal)

    # plaintext: every server takes TLS only (nats-py may never return from a failed TLS upgrade)
    async def plaintext(url: str) -> str:
        try:
            connecting = connect_as([url], cluster.creds("gateway"), name="attacker")
            nc, _ = await asyncio.wait_for(connecting, 10)
        except Exception as exc:
            return str(exc) or type(exc).__name__
        await nc.close()
        return "connected"

    for url in servers:
        plain = url.replace("tls://", "nats://")
        refusal = in_ns(attacker, lambda plain=plain: plaintext(plain), 30)  # type: ignore[misc]
        assert refusal != "connected", plain

    # a gateway's credentials: no write to the plan key, no purge or delete of the request stream
    forged = b'{"version": 999999}'

    async def as_gateway() -> tuple[list[bool], list[str], list[bytes]]:
        nc, errors = await connect_as(
            servers, cluster.creds("gateway"), name="attacker", tls_ca=cluster.tls_ca.cert
        )
        try:
            js = nc.jetstream(timeout=DENIED_WITHIN_S)
            kv = await js.key_value(names.PLAN_BUCKET)
            refused = [
                await _refused(kv.put(names.PLAN_KEY, forged)),
                await _refused(kv.delete(names.PLAN_KEY)),
                await _refused(js.purge_stream(names.REQUESTS_STREAM)),
                await _refused(js.delete_stream(names.REQUESTS_STREAM)),
            ]
            return refused, [str(e) for e in errors], await plan_history(nc)
        finally:
            await nc.close()

    refused, violations, history = in_ns(attacker, as_gateway, 60)
    assert refused == [True] * 4, refused
    assert sum("permissions violation" in v.lower() for v in violations) >= 4, violations
    # the key holds only the coordinators' records (the leader may have re-planned meanwhile)
    assert history and forged not in history
    assert all(decode_json(bus_pb2.Plan, r).HasField("signed") for r in history)

    async def request_stream_kept() -> bool:
        nc, _ = await connect_as(servers, cluster.creds("ops"), name="test-ops", tls_ca=cluster.tls_ca.cert)
        try:
            info = await nc.jetstream().stream_info(names.REQUESTS_STREAM)
            return info.config.num_replicas == 3
        finally:
            await nc.close()

    assert in_ns(lab.host("user").netns, request_stream_kept, 30)

    # a recorded signed plan of an earlier version, replayed (with the coordinator's NATS
    # credential: no other role may write the key): every node counts it `replayed`, no answer changes
    replayed_before = _replayed_counts(cluster)

    async def replay() -> bus_pb2.Plan:
        async with step("record the plan key's history as a gateway"):
            nc, _ = await connect_as(
                servers, cluster.creds("gateway"), name="attacker-recorder", tls_ca=cluster.tls_ca.cert
            )
            try:
                records = await plan_history(nc)
            finally:
                await nc.close()
        # older as a plan follower orders them: version, then active pipelines (a `loading` copy)
        orders = [plan_order(decode_json(bus_pb2.Plan, r)) for r in records]
        older = [r for r, order in zip(records, orders, strict=True) if order < orders[-1]]
        assert older, f"the plan key holds no record older than the last: {orders}"
        async with step("replay the oldest record as the coordinator's NATS user"):
            thief, _ = await connect_as(
                servers, cluster.creds("coordinator-1"), name="attacker", tls_ca=cluster.tls_ca.cert
            )
            try:
                plans = await thief.jetstream().key_value(names.PLAN_BUCKET)
                await plans.put(names.PLAN_KEY, older[0])  # the recorded bytes, signature and all
            finally:
                await thief.close()
        return decode_json(bus_pb2.Plan, older[0])

    old = in_ns(attacker, replay, 60)
    wait_for(
        lambda: all(count > replayed_before[node] for node, count in _replayed_counts(cluster).items()),
        30,
        f"every node counts the replayed plan version {old.version} `replayed`",
        poll_s=1.0,
    )
    results = in_ns(
        lab.host("user").netns, lambda: stream_many(cluster.gateway_url, PROMPTS[:2], MAX_TOKENS), 120
    )
    assert_complete(results, reference)


def _replayed_counts(cluster: MultiHostCluster) -> dict[str, int]:
    """Each shard node's `replayed` count, from its next heartbeat (heard as the ops role)."""

    async def read(nc: Client) -> dict[str, bus_pb2.Heartbeat]:
        return await heartbeats(nc, SHARDS, 10)

    beats = on_bus(cluster, cluster.lab.host("user").netns, "ops", read)
    assert isinstance(beats, dict) and set(beats) == SHARDS, beats
    return {node: int(beat.security_rejections.get("replayed", 0)) for node, beat in beats.items()}


def test_a_stolen_shard_credential_cannot_speak_for_another_node(cluster: MultiHostCluster, lab: Lab) -> None:
    """shard-3's own NATS credential, used from the attacker's namespace: it connects (it is a real
    user), but every server refuses it shard-1's heartbeat, handshake offers as shard-1, shard-1's
    incoming offers and inbox, and another model's requests; the coordinators hear nothing."""
    forged_hb = names.heartbeat_subject("shard-1")

    async def as_shard_3() -> tuple[list[str], int]:
        heard: list[str] = []
        nc, _ = await connect_as(
            cluster.nats_urls(), cluster.creds("ops"), name="test-ops", tls_ca=cluster.tls_ca.cert
        )
        thief, errors = await connect_as(
            cluster.nats_urls(), cluster.creds("shard-3"), name="attacker", tls_ca=cluster.tls_ca.cert
        )
        try:

            async def on_beat(msg: Msg) -> None:
                if b"forged" in msg.data:
                    heard.append(msg.subject)

            await nc.subscribe(forged_hb, cb=on_beat)
            await nc.flush()
            await thief.subscribe(names.handshakes_to("shard-1"))
            await thief.subscribe("_INBOX.shard-1.>")
            await thief.publish(forged_hb, b"forged")
            await thief.publish(names.handshake_subject("shard-2", "shard-1"), b"forged offer")
            pull = thief.jetstream(timeout=DENIED_WITHIN_S).pull_subscribe(
                names.request_subject("another-model"),
                durable=names.stage0_consumer("another-model"),
                stream=names.REQUESTS_STREAM,
            )
            assert await _refused(pull)
            await thief.flush()
            await asyncio.sleep(1.0)
            return [str(e) for e in errors], len(heard)
        finally:
            await thief.close()
            await nc.close()

    violations, heard = in_ns(lab.host("attacker").netns, as_shard_3, 60)
    assert heard == 0
    refused = [v for v in violations if "permissions violation" in v.lower()]
    assert len(refused) >= 4, violations  # 2 subscriptions, 2 publishes (and the pull's API call)
    assert any("shard-1" in v for v in refused), refused


def test_a_node_revoked_under_16_streams_is_dropped_and_loses_no_request(
    cluster: MultiHostCluster, lab: Lab, reference: dict[str, str]
) -> None:
    """`mohawk pki revoke --nats-url` (the command, on host a) of a serving node that is not stage
    0, while 16 greedy streams run: every server drops its connection within 5 s and refuses its
    credential, and every stream finishes with the single process's text. Runs last: the node
    stays revoked."""
    user = lab.host("user").netns
    wait_for(lambda: len(served_by(current_plan(cluster, user))) >= 2, 120, "a plan of 2+ nodes", poll_s=1.0)
    plan = current_plan(cluster, user)
    assert plan is not None
    active = next(p for p in pipelines(plan) if p.active)
    victim = active.stages[-1].node_id  # never stage 0: its requests resume elsewhere
    serial = load_bundle(cluster.pki_dir / "nodes" / victim, role="shard").identity.body.serial
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(NUM_STREAMS)]
    progress = Progress(NUM_STREAMS)
    streams = start_in_ns(
        user, lambda: stream_many(cluster.gateway_url, prompts, MAX_TOKENS, progress), STREAMS_BOUND_S
    )
    wait_for(lambda: min(progress.snapshot()) > 0, 120, "all 16 streams are generating")
    started = time.monotonic()
    revoke = subprocess.Popen(
        [
            *("ip", "netns", "exec", lab.host("a").netns, sys.executable, "-m", "mohawk_cli", "pki"),
            *("revoke", "--serial", str(serial), "--pki-dir", str(cluster.pki_dir)),
            *("--nats-url", ",".join(cluster.nats_urls("a")), "--creds", str(cluster.creds("admin"))),
        ],
        env={**os.environ, TLS_CA_ENV: str(cluster.tls_ca.cert)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    name = f"shard-{victim}"  # the connection name its service gives
    wait_for(
        lambda: not any(name in conns for conns in cluster.connections().values()),
        DROPPED_WITHIN_S * 4,
        f"no server holds {victim}'s connection",
        poll_s=0.05,
    )
    dropped_s = time.monotonic() - started
    _, err = revoke.communicate(timeout=60)
    assert revoke.returncode == 0, err.decode()

    async def with_its_credential() -> str:
        try:
            nc, _ = await connect_as(
                cluster.nats_urls(), cluster.creds(victim), name="thief", tls_ca=cluster.tls_ca.cert
            )
        except ConnectionError as exc:
            return str(exc)
        await nc.close()
        return "connected"

    refusal = in_ns(lab.host("attacker").netns, with_its_credential, 30)
    results = streams.result(STREAMS_BOUND_S)
    print(
        f"\nrevoked {victim} under 16 streams: its connection closed on every server "
        f"{dropped_s:.2f} s after the command"
    )
    assert dropped_s < DROPPED_WITHIN_S
    assert "authorization violation" in refusal.lower(), refusal
    assert len(results) == NUM_STREAMS
    assert_complete(results, reference)
