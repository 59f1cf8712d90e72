"""Secure channels against a real nats-server: when a node holds two plans at once (make before
break), one handshake subject, two managers, and only the one serving the offer's plan version
answers; the responder's pending handshakes are capped per peer and survive bogus finishes; offers
must be signed, and only the peer asked can refuse a handshake."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from mohawk_common.bus import channels as channels_module
from mohawk_common.bus import names
from mohawk_common.bus.channels import ChannelManager
from mohawk_common.bus.connect import connect, server_has_all
from mohawk_common.bus.nats_auth import init_auth, issue_user
from mohawk_common.bus.security import Security
from mohawk_common.bus.server import NatsServer
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.handshake import HandshakeInitiator, sign_reply
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle
from mohawk_proto.v1 import security_pb2

PEERS = {"shard-a": 0, "shard-b": 1}


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    init_pki(tmp_path / "pki")
    for node in PEERS:
        issue_node(tmp_path / "pki", node, "shard")
    return tmp_path / "pki"


def security(pki: Path, node: str) -> Security:
    return Security(load_bundle(pki / "nodes" / node, role="shard"), CryptographyKem(), role="shard")


def manager(nc: Client, sec: Security, node: str, version: int) -> ChannelManager:
    """`node`'s channel manager for plan `version` of the two-node plan `PEERS`."""
    return ChannelManager(nc, sec, node_id=node, plan_version=version, expected_peers=PEERS)


def test_the_manager_of_the_offers_plan_answers_and_an_unserved_plan_is_refused(
    nats_server: NatsServer, pki: Path
) -> None:
    async def scenario() -> None:
        a_nc = await connect([nats_server.url], name="a", attempts=3)
        b_nc = await connect([nats_server.url], name="b", attempts=3)
        a_sec, b_sec = security(pki, "shard-a"), security(pki, "shard-b")

        # shard-b serves plan 1 and has loaded plan 2 beside it; both listen on mohawk.v1.hs.shard-b
        b_old, b_new = manager(b_nc, b_sec, "shard-b", 1), manager(b_nc, b_sec, "shard-b", 2)
        for m in (b_old, b_new):
            await m.start()
        # the server has b's subscriptions before a (another connection) sends its first offer; a
        # node's own later messages (its ready report) come after them on its one connection
        await server_has_all(b_nc)
        try:
            for version, answering in ((2, b_new), (1, b_old), (2, b_new)):
                a = manager(a_nc, a_sec, "shard-a", version)
                await a.start()
                try:
                    channel = await a.channel_to("shard-b")
                    # the right manager installed it: its peer's channel is the one the initiator holds
                    assert answering.receiving(channel.channel_id).peer_id == "shard-a"
                finally:
                    await a.stop()
            assert not b_sec.rejections  # neither manager refused the other's offers
            stray = manager(a_nc, a_sec, "shard-a", 3)
            await stray.start()
            with pytest.raises(AuthenticationError, match="refused"):
                async with asyncio.timeout(5):  # refused at once, not left to time out
                    await stray.channel_to("shard-b")
            await stray.stop()
            await b_old.stop()  # plan 1 gone: the plan-2 manager alone answers, still
            a = manager(a_nc, a_sec, "shard-a", 2)
            await a.start()
            assert b_new.receiving((await a.channel_to("shard-b")).channel_id).peer_id == "shard-a"
            await a.stop()
        finally:
            await b_new.stop()
            await a_nc.close()
            await b_nc.close()

    asyncio.run(scenario())


async def ask(nc: Client, kind: str, data: bytes, sender: str = "shard-a") -> security_pb2.HandshakeReply:
    """One handshake message to shard-b on `sender`'s subject (on a bus with users, only `sender`'s
    may publish there; this one has none, so any client may)."""
    msg = await nc.request(
        names.handshake_subject("shard-b", sender), data, timeout=5, headers={"Mohawk-Handshake": kind}
    )
    return security_pb2.HandshakeReply.FromString(msg.data)


def initiator(sec: Security) -> HandshakeInitiator:
    bundle = sec.require()
    return HandshakeInitiator(
        bundle.identity,
        bundle.trust,
        plan_version=1,
        responder_id="shard-b",
        accept_peer=lambda _peer, _offer: None,
        kem=sec.kem,
    )


def test_a_bogus_finish_ends_no_handshake_and_a_peers_offers_past_its_cap_replace_its_oldest(
    nats_server: NatsServer, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channels_module, "MAX_PENDING_PER_PEER", 2)

    async def scenario() -> None:
        nc = await connect([nats_server.url], name="a", attempts=3)
        a_sec, b_sec = security(pki, "shard-a"), security(pki, "shard-b")
        b = ChannelManager(nc, b_sec, node_id="shard-b", plan_version=1, expected_peers=PEERS)
        await b.start()
        await server_has_all(nc)
        try:
            # shard-a's signed offer sent on shard-c's subject: the bus user and the signer differ
            assert (await ask(nc, "init", initiator(a_sec).init_message(), sender="shard-c")).refused
            assert b_sec.rejections.pop("untrusted") == 1
            real = initiator(a_sec)
            finish, keys = real.handle_response((await ask(nc, "init", real.init_message())).message)
            assert (await ask(nc, "finish", finish, sender="shard-c")).refused  # the finish, likewise
            assert b_sec.rejections.pop("untrusted") == 1
            # someone who sniffed the channel id sends a finish for it first: refused, counted...
            bogus = security_pb2.HandshakeFinish(channel_id=real.channel_id)
            bogus.signature.ecdsa_p256, bogus.signature.mldsa65 = b"\x30" * 70, b"\x00" * 3309
            assert (await ask(nc, "finish", bogus.SerializeToString())).refused
            assert sum(b_sec.rejections.values()) == 1
            # ...and the real finish still opens the channel
            assert (await ask(nc, "finish", finish)).message == b"ok"
            assert b.receiving(keys.channel_id).peer_id == "shard-a"
            assert (await ask(nc, "finish", finish)).refused  # consumed: once only

            # an offer with shard-a's certificate (public: heartbeats carry it) but not its
            # signature is refused before it takes a place or any KEM work
            forged = security_pb2.HandshakeInit.FromString(initiator(a_sec).init_message())
            forged.ClearField("signature")
            assert (await ask(nc, "init", forged.SerializeToString())).refused
            assert b_sec.rejections["unsigned"] == 1
            # shard-a's own offers: two wait for their finish (its cap); a third replaces the oldest
            offers = [initiator(a_sec) for _ in range(3)]
            answers = [await ask(nc, "init", o.init_message()) for o in offers]
            assert not any(answer.refused for answer in answers)
            assert b_sec.rejections["overloaded"] == 1
            finishes = [o.handle_response(r.message)[0] for o, r in zip(offers, answers, strict=True)]
            assert (await ask(nc, "finish", finishes[0])).refused  # the oldest: dropped
            assert (await ask(nc, "finish", finishes[2])).message == b"ok"
        finally:
            await b.stop()
            await nc.close()

    asyncio.run(scenario())


class SlowManager(ChannelManager):
    """A responder that answers 0.2 s late, so another client's answer surely comes first."""

    async def _on_handshake(self, msg: Msg) -> bool:
        await asyncio.sleep(0.2)
        return await super()._on_handshake(msg)


def test_no_one_but_the_peer_can_refuse_its_handshake(nats_server: NatsServer, pki: Path) -> None:
    """A client that may subscribe to shard-b's handshake subject (any shard credential could)
    answers every request first: with an unsigned refusal, and with one signed by a certified
    node that is not shard-b. The channel forms all the same; each is counted and ignored."""
    issue_node(pki, "shard-c", "shard")
    c_identity = load_bundle(pki / "nodes" / "shard-c", role="shard").identity

    async def scenario() -> None:
        a_nc = await connect([nats_server.url], name="a", attempts=3)
        b_nc = await connect([nats_server.url], name="b", attempts=3)
        racer = await connect([nats_server.url], name="racer", attempts=3)
        a_sec, b_sec = security(pki, "shard-a"), security(pki, "shard-b")

        async def refuse_first(msg: Msg) -> None:
            await msg.respond(security_pb2.HandshakeReply(refused=True).SerializeToString())
            await msg.respond(sign_reply(c_identity, msg.data, security_pb2.HandshakeReply(refused=True)))

        await racer.subscribe(names.handshakes_to("shard-b"), cb=refuse_first)
        b = SlowManager(b_nc, b_sec, node_id="shard-b", plan_version=1, expected_peers=PEERS)
        a = ChannelManager(a_nc, a_sec, node_id="shard-a", plan_version=1, expected_peers=PEERS)
        await b.start()
        await a.start()
        for nc in (a_nc, b_nc, racer):
            await server_has_all(nc)
        try:
            channel = await a.channel_to("shard-b")
            assert b.receiving(channel.channel_id).peer_id == "shard-a"
            # both the offer and the finish drew the two false refusals
            assert a_sec.rejections["unsigned"] == 2
            assert a_sec.rejections["untrusted"] == 2
        finally:
            await a.stop()
            await b.stop()
            for nc in (a_nc, b_nc, racer):
                await nc.close()

    asyncio.run(scenario())


def test_a_certificate_bound_to_another_model_opens_no_channel(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Both ends check the peer's certificate against the plan's model: the responder the
    initiator's, the initiator the responder's; a certificate naming no model serves any."""
    pki = tmp_path / "pki"
    init_pki(pki)
    issue_node(pki, "shard-a", "shard", models=("model-a",))  # bound to model-a
    issue_node(pki, "shard-b", "shard")  # bound to none, as before certificates named a model

    async def scenario() -> None:
        nc = await connect([nats_server.url], name="ab", attempts=3)
        a_sec, b_sec = security(pki, "shard-a"), security(pki, "shard-b")
        versions = iter(range(1, 100))

        async def open_channel(first: str, second: str, model: str) -> None:
            """`first` (stage 0) opens a channel to `second` (stage 1) for a plan of `model`."""
            version, peers = next(versions), {first: 0, second: 1}
            by_node = {"shard-a": a_sec, "shard-b": b_sec}
            managers = [
                ChannelManager(
                    nc, by_node[node], node_id=node, plan_version=version, expected_peers=peers, model=model
                )
                for node in (first, second)
            ]
            for m in managers:
                await m.start()
            await server_has_all(nc)
            try:
                await managers[0].channel_to(second)
            finally:
                for m in managers:
                    await m.stop()

        try:
            await open_channel("shard-a", "shard-b", "model-a")
            await open_channel("shard-b", "shard-a", "model-a")
            assert not a_sec.rejections and not b_sec.rejections
            with pytest.raises(AuthenticationError):  # the responder refuses shard-a's offer
                await open_channel("shard-a", "shard-b", "model-b")
            assert b_sec.rejections == {"untrusted": 1} and not a_sec.rejections
            with pytest.raises(AuthenticationError) as info:  # the initiator refuses shard-a's answer
                await open_channel("shard-b", "shard-a", "model-b")
            assert info.value.detail == "shard-a's certificate is for model 'model-a', not 'model-b'"
            assert b_sec.rejections == {"untrusted": 2} and not a_sec.rejections
        finally:
            await nc.close()

    asyncio.run(scenario())


def test_a_peer_nobody_listens_for_fails_at_once_and_counts_nothing(
    nats_server: NatsServer, pki: Path
) -> None:
    """No subscriber on the peer's handshake subject (a node still starting): the server's
    no-responders answer ends the attempt at once, as a NATS request's would, and is not counted
    as a forged reply."""

    async def scenario() -> None:
        nc = await connect([nats_server.url], name="a", attempts=3)
        a_sec = security(pki, "shard-a")
        a = ChannelManager(nc, a_sec, node_id="shard-a", plan_version=1, expected_peers=PEERS)
        await a.start()
        try:
            started = time.monotonic()
            with pytest.raises(NoRespondersError):
                await a.channel_to("shard-b")
            assert time.monotonic() - started < 2
            assert not a_sec.rejections
        finally:
            await a.stop()
            await nc.close()

    asyncio.run(scenario())


def test_a_node_holding_two_plans_answers_handshakes_as_its_own_bus_user(tmp_path: Path, pki: Path) -> None:
    """With a NATS user per process, a node may answer a request once per delivery allowance, and
    nats-server counts every delivery of the request against it: two subscriptions of the
    handshake subject (one per manager) left the node's one answer refused, and its peer timed out
    (a restarted stage 0 met a neighbour loading its next stage). The managers share one
    subscription, so the plan-2 manager's answer goes through while plan 1's is still held."""
    auth = init_auth(tmp_path / "nats-auth")
    for node in PEERS:
        issue_user(auth, node, "shard", auth.creds(node), models=("m",))
    server = NatsServer(tmp_path / "nats", auth=auth).start()

    async def scenario() -> None:
        a_nc = await connect([server.url], name="shard-a", attempts=3, creds=auth.creds("shard-a"))
        b_nc = await connect([server.url], name="shard-b", attempts=3, creds=auth.creds("shard-b"))
        a_sec, b_sec = security(pki, "shard-a"), security(pki, "shard-b")

        b_old, b_new = manager(b_nc, b_sec, "shard-b", 1), manager(b_nc, b_sec, "shard-b", 2)
        for m in (b_old, b_new):
            await m.start()
        await server_has_all(b_nc)
        a = manager(a_nc, a_sec, "shard-a", 2)
        await a.start()
        try:
            async with asyncio.timeout(5):  # a refused answer would leave it to the 10 s timeout
                channel = await a.channel_to("shard-b")
            assert b_new.receiving(channel.channel_id).peer_id == "shard-a"
        finally:
            for m in (a, b_old, b_new):
                await m.stop()
            await a_nc.close()
            await b_nc.close()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
