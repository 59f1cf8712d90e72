"""Attacks on the control plane of a real secure cluster (2 nodes, default settings): a forged plan
(layer ranges swapped, version + 1000), a plan signed by a shard's certificate, a recorded plan
replayed after a newer one, and a forged heartbeat asking the leader to nak a subject it names.
Each is refused and counted in the nodes' heartbeats; the answers do not change."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_common.bus import names
from mohawk_common.bus.connect import connect, server_has_all
from mohawk_common.bus.control import decode_json, encode_json
from mohawk_common.bus.control_records import sign_record
from mohawk_common.bus.plan_follower import parse_plan
from mohawk_common.bus.server import free_port
from mohawk_pqc.pki_files import load_bundle
from mohawk_proto.v1 import bus_pb2
from tests.integration.cluster_helpers import chat
from tests.security.attacks.bus_client import BusClient

PROMPT = "Name three colours."


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        nodes=2,
        port=free_port(),
        nats_port=free_port(),
        data_dir=tmp_path_factory.mktemp("attacks"),
        nats_auth=True,
    )
    with LocalCluster(spec) as running:
        running.wait_ready(timeout=240)
        yield running


def answer(cluster: LocalCluster) -> str:
    return str(chat(cluster.url, PROMPT, max_tokens=12)["choices"][0]["message"]["content"])


def rejections(client: BusClient) -> dict[str, dict[str, int]]:
    """Each node's security rejections, as its next heartbeat reports them."""

    async def collect() -> dict[str, dict[str, int]]:
        seen: dict[str, dict[str, int]] = {}
        sub = await client.nc.subscribe(names.HEARTBEAT_WILDCARD)
        deadline = time.monotonic() + 5
        while len(seen) < 2 and time.monotonic() < deadline:
            try:
                msg = await sub.next_msg(timeout=1)
            except NatsTimeoutError:
                continue
            heartbeat = decode_json(bus_pb2.Heartbeat, msg.data)
            seen[heartbeat.node_id] = dict(heartbeat.security_rejections)
        await sub.unsubscribe()
        return seen

    return client.run(collect())


def test_forged_shard_signed_and_replayed_plans_change_no_answer_and_are_counted(
    cluster: LocalCluster,
) -> None:
    before = answer(cluster)
    with BusClient(cluster.nats.url, creds=cluster.nats_creds("ops")) as client:
        plan_kv = client.run(client.nc.jetstream().key_value(names.PLAN_BUCKET))
        history = client.run(plan_kv.history(names.PLAN_KEY))
        signed = [decode_json(bus_pb2.Plan, e.value) for e in history if e.value]
        current = signed[-1]
        loading = next(p for p in signed if p.version == current.version and p.state == "loading")
        node_ids = [s.node_id for s in current.stages]
        assert len(node_ids) == 2

    forged = bus_pb2.Plan()
    forged.CopyFrom(current)
    forged.version += 1000
    forged.ClearField("signed")
    (a, b) = forged.stages
    a.start, a.end, b.start, b.end = b.start, b.end, a.start, a.end  # what broke every answer
    by_a_shard = bus_pb2.Plan()
    by_a_shard.CopyFrom(forged)
    by_a_shard.version += 1
    by_a_shard.leader = node_ids[0]
    shard = load_bundle(cluster.pki_dir / "nodes" / node_ids[0], role="shard").identity
    sign_record(by_a_shard, shard, "plan")

    with BusClient(cluster.nats.url, creds=cluster.nats_creds("coordinator-1")) as writer:
        # the one credential the bus lets write the plan: only the signature stops these
        plan_kv = writer.run(writer.nc.jetstream().key_value(names.PLAN_BUCKET))
        for record in (forged, by_a_shard, loading):
            writer.run(plan_kv.put(names.PLAN_KEY, encode_json(record)))
            time.sleep(0.3)
        time.sleep(1.5)  # a heartbeat interval: the nodes report what they refused
        counts = rejections(writer)
    assert answer(cluster) == before
    assert cluster.is_ready()
    for node_id in node_ids:
        assert counts[node_id].get("unsigned", 0) >= 1, counts
        assert counts[node_id].get("untrusted", 0) >= 1, counts
        assert counts[node_id].get("replayed", 0) >= 1, counts


def test_a_forged_heartbeat_cannot_make_the_leader_nak_a_subject_it_names(cluster: LocalCluster) -> None:
    victim = f"{names.PREFIX}.victim"
    heartbeat = bus_pb2.Heartbeat(node_id="forged-node", role="shard", model="smollm2-135m-instruct")
    heartbeat.held_requests.append(victim)
    with (
        BusClient(cluster.nats.url, creds=cluster.nats_creds("shard-1")) as forger,
        BusClient(cluster.nats.url, creds=cluster.nats_creds("ops")) as watcher,
    ):
        seen = watcher.run(watcher.nc.subscribe(victim))
        watcher.run(server_has_all(watcher.nc))

        async def attack() -> None:
            for started in (1, 2, 3):  # each "restart" would hand the held subjects back
                heartbeat.started_at_ms = started
                await forger.nc.publish(names.heartbeat_subject("forged-node"), encode_json(heartbeat))
                await server_has_all(forger.nc)
                await asyncio.sleep(0.3)

        async def delivered() -> int:
            count = 0
            try:
                while True:
                    await seen.next_msg(timeout=2)
                    count += 1
            except NatsTimeoutError:
                return count

        forger.run(attack())
        assert watcher.run(delivered()) == 0


def test_without_the_coordinators_credential_the_plan_cannot_even_be_written(cluster: LocalCluster) -> None:
    with pytest.raises(ConnectionError, match=r"(?i)authorization violation"):
        asyncio.run(connect(cluster.nats.url, name="anonymous", attempts=1))
    with BusClient(cluster.nats.url, creds=cluster.nats_creds("ops")) as reader:
        plan_kv = reader.run(reader.nc.jetstream().key_value(names.PLAN_BUCKET))
        before = reader.run(plan_kv.get(names.PLAN_KEY))
    with BusClient(cluster.nats.url, creds=cluster.nats_creds("gateway")) as gateway:
        js = gateway.nc.jetstream(timeout=2)
        plan_kv = gateway.run(js.key_value(names.PLAN_BUCKET))
        for attempt in (
            plan_kv.put(names.PLAN_KEY, b"{}"),
            plan_kv.delete(names.PLAN_KEY),
            js.purge_stream(names.REQUESTS_STREAM),
            js.delete_stream(names.REQUESTS_STREAM),
        ):
            with pytest.raises(Exception):  # noqa: B017 - a permission violation shows as a timeout or an API error
                gateway.run(attempt)
    with BusClient(cluster.nats.url, creds=cluster.nats_creds("ops")) as reader:
        plan_kv = reader.run(reader.nc.jetstream().key_value(names.PLAN_BUCKET))
        assert reader.run(plan_kv.get(names.PLAN_KEY)).revision == before.revision
    assert cluster.is_ready()


def test_no_record_written_with_the_coordinators_credential_stops_re_planning(cluster: LocalCluster) -> None:
    """The records the coordinators' own bus credential can write: huge, negative and missing
    versions, garbage, and the oldest signed plan put back after the key's history is purged. The
    coordinator keeps running (it used to exit on `version = 2**63 - 1`, and `mohawk up` restarted
    it into the same record) and still re-plans when a node is killed, whose recorded heartbeat
    is replayed meanwhile. Last in this module: it kills a node of the shared cluster."""
    with BusClient(cluster.nats.url, creds=cluster.nats_creds("coordinator-1")) as writer:
        plan_kv = writer.run(writer.nc.jetstream().key_value(names.PLAN_BUCKET))
        history = writer.run(plan_kv.history(names.PLAN_KEY))
        oldest_signed = next(e.value for e in history if e.value and b'"signed"' in e.value)
        for record in (
            b'{"version": "9223372036854775807"}',
            b'{"version": "-9223372036854775808"}',
            b'{"version": "many"}',
            b"\x00\xff garbage",
        ):
            writer.run(plan_kv.put(names.PLAN_KEY, record))
            time.sleep(0.3)
        writer.run(plan_kv.purge(names.PLAN_KEY))
        writer.run(plan_kv.put(names.PLAN_KEY, oldest_signed))
    time.sleep(1.5)
    assert "coordinator-1" not in cluster.exited()
    assert answer(cluster)  # still served

    # and shard-2's own last heartbeat, recorded and replayed after it is killed, does not keep it
    # planned (it used to: signed heartbeats carried nothing a replay could be told by)
    with (
        BusClient(cluster.nats.url, creds=cluster.nats_creds("ops")) as reader,
        BusClient(cluster.nats.url, creds=cluster.nats_creds("shard-1")) as replayer,
    ):
        beats = reader.run(reader.nc.subscribe(names.heartbeat_subject("shard-2")))
        recorded = reader.run(beats.next_msg(timeout=5)).data
        cluster.kill("shard-2")
        plan_kv = reader.run(reader.nc.jetstream().key_value(names.PLAN_BUCKET))
        deadline, stages = time.monotonic() + 90, None
        while time.monotonic() < deadline:
            replayer.run(replayer.nc.publish(names.heartbeat_subject("shard-2"), recorded))
            plan = parse_plan(reader.run(plan_kv.get(names.PLAN_KEY)).value or b"")
            stages = {s.node_id for s in plan.stages}
            if plan.signed.signature and stages == {"shard-1"} and cluster.is_ready():
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"no plan without shard-2 within 90 s: stages {stages}")
    assert "coordinator-1" not in cluster.exited()
    assert answer(cluster)
