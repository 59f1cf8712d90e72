"""The secured bus, end to end against a real nats-server: a sniffer on `>` sees no plaintext, and
tampered, replayed, plaintext, forged, expired, revoked and downgraded traffic is rejected, logged,
counted in the nodes' heartbeats, and serving goes on."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_common.bus import names
from mohawk_common.bus.connect import connect, server_has_all
from mohawk_common.bus.control import decode_json
from mohawk_common.bus.frames import split_message
from mohawk_common.bus.server import free_port
from mohawk_common.bus.setup import ensure_buckets
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.handshake import HandshakeInitiator
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle, revoke
from mohawk_proto.v1 import bus_pb2, security_pb2
from tests.integration.cluster_helpers import chat

ACT = f"{names.PREFIX}.act."
SECRET_PROMPT = "Describe the zebra called Quixotegranola in detail."


class Sniffer:
    """Everything published on the server, from a subscription to `>` on its own thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.messages: list[tuple[str, bytes, dict[str, str]]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> Sniffer:
        self._thread.start()
        self._nc = self._run(connect([self.url], name="sniffer", attempts=3))
        self._run(self._nc.subscribe(">", cb=self._on_message))
        self._run(server_has_all(self._nc))
        return self

    async def _on_message(self, msg: Msg) -> None:
        self.messages.append((msg.subject, msg.data, dict(msg.headers or {})))

    def _run(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def publish(self, subject: str, data: bytes) -> None:
        self._run(self._nc.publish(subject, data))
        self._run(server_has_all(self._nc))

    def request(self, subject: str, data: bytes, kind: str) -> security_pb2.HandshakeReply:
        msg = self._run(self._nc.request(subject, data, timeout=10, headers={"Mohawk-Handshake": kind}))
        return security_pb2.HandshakeReply.FromString(msg.data)

    def heartbeats(self) -> dict[str, bus_pb2.Heartbeat]:
        time.sleep(2.5)
        seen = {}
        for subject, data, _ in list(self.messages):
            if subject.startswith(f"{names.PREFIX}.hb."):
                heartbeat = decode_json(bus_pb2.Heartbeat, data)
                seen[heartbeat.node_id] = heartbeat
        return seen

    def __exit__(self, *exc: object) -> None:
        self._run(self._nc.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        nodes=2,
        port=free_port(),
        nats_port=free_port(),
        data_dir=tmp_path_factory.mktemp("secure"),
        threads_per_node=1,
        max_payload=256 * 1024,
    )
    with LocalCluster(spec) as running:
        running.wait_ready(timeout=240)
        yield running


def test_a_sniffer_on_every_subject_sees_no_plaintext(cluster: LocalCluster) -> None:
    with Sniffer(cluster.nats.url) as sniffer:
        reply = chat(cluster.url, SECRET_PROMPT, max_tokens=24)
        text = reply["choices"][0]["message"]["content"]
        time.sleep(0.5)
        captured = list(sniffer.messages)
    assert len(text) >= 12
    everything = b"\n".join(data for _, data, _ in captured)
    assert b"Quixotegranola" not in everything and b"zebra" not in everything
    for word in {w for w in text.split() if len(w) >= 5}:
        assert word.encode() not in everything, word
    subjects = [subject for subject, _, _ in captured]
    requests = [(d, h) for s, d, h in captured if s.startswith(f"{names.PREFIX}.req.")]
    frames = [d for s, d, _ in captured if s.startswith(f"{names.PREFIX}.act.")]
    tokens = [s for s in subjects if s.startswith(f"{names.PREFIX}.tok.")]
    assert requests and frames and len(tokens) >= 12
    assert all(h.get("Mohawk-Sealed") == "1" for _, h in requests)
    assert all(split_message(f)[0].channel_id for f in frames), "an activation frame in plaintext"


def _handshake(sniffer: Sniffer, bundle_dir: Path, target: str) -> bool:
    """Offer a handshake to `target` as the holder of `bundle_dir`; True when it was answered."""
    bundle = load_bundle(bundle_dir, role="shard") if (bundle_dir / "node.cert").exists() else None
    assert bundle is not None
    initiator = HandshakeInitiator(
        bundle.identity,
        bundle.trust,
        plan_version=1,
        responder_id=target,
        accept_peer=lambda _peer, _offer: None,
        kem=CryptographyKem(),
    )
    sender = bundle.identity.body.node_id
    return not sniffer.request(
        names.handshake_subject(target, sender), initiator.init_message(), "init"
    ).refused


def test_tampered_replayed_plaintext_forged_expired_revoked_and_downgraded_are_rejected(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    pki = cluster.pki_dir
    with Sniffer(cluster.nats.url) as sniffer:
        chat(cluster.url, "Count to five.", max_tokens=8)
        time.sleep(0.3)
        into_stage_1 = [
            (s, d)
            for s, d, _ in sniffer.messages
            if s.startswith(f"{names.PREFIX}.act.") and s.endswith(".1")
        ]
        subject, frame = into_stage_1[-1]
        sniffer.publish(subject, frame)  # replayed
        header, _, body = split_message(frame)
        header.seq += 1000  # a fresh sequence number, so only the tag can refuse it: the header is AAD
        forged_head = header.SerializeToString()
        sniffer.publish(subject, len(forged_head).to_bytes(4, "little") + forged_head + body)  # tampered
        header.ClearField("channel_id")
        head = header.SerializeToString()
        sniffer.publish(subject, len(head).to_bytes(4, "little") + head + body)  # plaintext
        # an identity from another root (a forged certificate for a real node id)
        other = tmp_path / "other"
        init_pki(other)
        assert not _handshake(sniffer, issue_node(other, "shard-1", "shard", models=("x",)), "shard-2")
        # expired, then revoked, certificates of the real root
        expired = issue_node(pki, "old-node", "shard", days=1, not_before=time.time() - 5 * 86400)
        assert not _handshake_unchecked(sniffer, expired, "shard-2")
        revoked_dir = issue_node(pki, "gone-node", "shard")
        serial = load_bundle(revoked_dir, role="shard").identity.body.serial
        crl = revoke(pki, [serial])
        asyncio.run(_put_crl(cluster.nats.url, crl.SerializeToString()))
        time.sleep(1.0)
        assert not _handshake(sniffer, revoked_dir, "shard-2")
        # a downgrade: an offer without ML-KEM
        downgrade = security_pb2.HandshakeInit(
            version=1, suites=["x25519/aes-256-gcm/hkdf-sha256"], channel_id=b"d" * 16, responder_id="shard-2"
        )
        assert sniffer.request(
            names.handshake_subject("shard-2", "shard-1"), downgrade.SerializeToString(), "init"
        ).refused
        heartbeats = sniffer.heartbeats()
    counts: dict[str, int] = {}
    for heartbeat in heartbeats.values():
        assert not heartbeat.insecure
        for reason, count in heartbeat.security_rejections.items():
            counts[reason] = counts.get(reason, 0) + count
    for reason in ("replayed", "tampered", "plaintext", "expired", "revoked", "downgrade"):
        assert counts.get(reason, 0) >= 1, (reason, counts)
    # the tampered frame, and the forged certificate that fails the root's signature
    assert counts["tampered"] >= 2, counts
    reply = chat(cluster.url, "What is two plus two?", max_tokens=8)
    assert reply["choices"][0]["message"]["content"]


def _handshake_unchecked(sniffer: Sniffer, bundle_dir: Path, target: str) -> bool:
    """Like `_handshake`, for a bundle whose own certificate no longer loads (expired)."""
    from mohawk_pqc.identity import Identity
    from mohawk_pqc.pki_files import read_message

    cert = read_message(bundle_dir / "node.cert", security_pb2.Certificate)
    key = read_message(bundle_dir / "node.key", security_pb2.PrivateKeyBundle)
    identity = Identity.from_files(cert, key)
    trust = load_bundle(bundle_dir.parent / "shard-1", role="shard").trust
    initiator = HandshakeInitiator(
        identity,
        trust,
        plan_version=1,
        responder_id=target,
        accept_peer=lambda *_: None,
        kem=CryptographyKem(),
    )
    try:
        subject = names.handshake_subject(target, identity.body.node_id)
        return not sniffer.request(subject, initiator.init_message(), "init").refused
    except AuthenticationError:
        return False


async def _put_crl(url: str, data: bytes) -> None:
    nc = await connect([url], name="operator", attempts=3)
    try:
        buckets = await ensure_buckets(nc.jetstream())
        await buckets.pki.put(names.CRL_KEY, data)
    finally:
        await nc.close()
