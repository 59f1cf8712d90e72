"""Gateway presence against a real nats-server: a key that lapses (TTL) makes its gateway gone after the
grace; a key refreshed in time never does; no verdict while the bus is away. A presence value that
is not its gateway's signed, fresh record counts as missing and is counted."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import encode_json
from mohawk_common.bus.control_records import RecordVerifier, sign_record
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import BusLimits, ensure_buckets
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.gateways import MAX_PRESENCE_AGE_S, GatewayPresence, check_presence


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki")
    init_pki(path)
    for node_id, role in (("gw-a", "gateway"), ("gw-b", "gateway"), ("node-a", "shard")):
        issue_node(path, node_id, role)
    return path


def presence(
    pki: Path,
    signer: str,
    role: str,
    *,
    gateway_id: str = "gw-a",
    instance: str = "gw-a-1",
    age_s: float = 0.0,
) -> bytes:
    record = bus_pb2.GatewayPresence(
        gateway_id=gateway_id, instance=instance, pid=42, at_ms=int((time.time() - age_s) * 1000)
    )
    identity = load_bundle(pki / "nodes" / signer, role=role).identity
    return encode_json(sign_record(record, identity, "presence"))


def verifier(pki: Path) -> RecordVerifier:
    return RecordVerifier(load_bundle(pki / "nodes" / "node-a", role="shard").trust)


def test_a_gateways_own_fresh_record_is_present(pki: Path) -> None:
    record = check_presence(presence(pki, "gw-a", "gateway"), "gw-a-1", verifier(pki))
    assert (record.gateway_id, record.pid) == ("gw-a", 42)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (lambda pki: b"12345", "malformed"),  # the old unsigned pid
        (lambda pki: encode_json(bus_pb2.GatewayPresence(gateway_id="gw-a", instance="gw-a-1")), "unsigned"),
        (lambda pki: presence(pki, "gw-b", "gateway"), "untrusted"),  # gw-b signs as gw-a
        (lambda pki: presence(pki, "node-a", "shard", gateway_id="node-a"), "untrusted"),  # not a gateway
        (lambda pki: presence(pki, "gw-a", "gateway", instance="gw-a-2"), "tampered"),  # another key's value
        (lambda pki: presence(pki, "gw-a", "gateway", age_s=MAX_PRESENCE_AGE_S + 5), "stale"),  # a replay
    ],
)
def test_anything_else_is_refused_with_a_reason(pki: Path, value, reason: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AuthenticationError) as refused:
        check_presence(value(pki), "gw-a-1", verifier(pki))
    assert refused.value.reason == reason


def test_a_forged_value_counts_as_missing_and_is_counted(nats_server: NatsServer, pki: Path) -> None:
    async def scenario() -> None:
        nc = await connect(nats_server.url, name="test")
        js = nc.jetstream()
        buckets = await ensure_buckets(js, BusLimits(gateway_ttl_s=30.0))
        await buckets.gateways.put("gw-a-1", presence(pki, "gw-a", "gateway"))
        await buckets.gateways.put(
            "gw-a-2", presence(pki, "gw-a", "gateway", instance="gw-a-2", age_s=60)
        )  # replayed
        rejected: list[str] = []
        watch = GatewayPresence(
            js, grace_s=0.0, verifier=verifier(pki), reject=lambda e: rejected.append(e.reason)
        )
        assert await watch.gone({"gw-a-1", "gw-a-2"}, asyncio.get_running_loop().time()) == {"gw-a-2"}
        assert rejected == ["stale"]
        await nc.close()

    asyncio.run(scenario())


@pytest.mark.slow  # over 5 s here: the inner loop leaves it to `make test`
def test_a_lapsed_gateway_is_gone_after_the_grace(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        nc = await connect(nats_server.url, name="test")
        js = nc.jetstream()
        buckets = await ensure_buckets(js, BusLimits(gateway_ttl_s=1.0))
        await buckets.gateways.put("alive", b"1")
        await buckets.gateways.put("dead", b"1")
        presence = GatewayPresence(js, grace_s=1.0)
        loop = asyncio.get_running_loop()
        assert await presence.gone({"alive", "dead"}, loop.time()) == set()
        gone: set[str] = set()
        for _ in range(40):  # TTL 1 s + grace 1 s, checked every 0.1 s
            await asyncio.sleep(0.1)
            await buckets.gateways.put("alive", b"1")
            gone = await presence.gone({"alive", "dead"}, loop.time())
            if gone:
                break
        assert gone == {"dead"}
        nats_server.kill()
        await asyncio.sleep(0.2)
        assert await presence.gone({"alive", "dead"}, loop.time()) == set()  # no bus, no verdict
        with contextlib.suppress(Exception):
            await nc.close()

    asyncio.run(scenario())
