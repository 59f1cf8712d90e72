"""Secure channels between pipeline stages: handshakes over NATS request/reply, one channel per peer and plan.

Design. For every pair of stages that exchange frames in a plan — stage i and i+1 (activations),
and the last stage and stage 0 (step results), and no other (`positions.may_open`; an offer from
any other position is refused and counted) — the lower stage initiates the handshake of
`mohawk_pqc.handshake` with the higher one on `mohawk.v1.hs.<peer>` (three messages: offer,
response, finish; the finish is a second request). Each side checks that the peer's certificate
names the node the plan puts at the other end, with role shard, and, when the certificate is bound
to a model, the plan's model (`check_model`; a certificate naming no model serves any). The result
is one `SecureChannel` per peer and plan version, with a sending and a receiving key; the higher
stage waits for the lower one's handshake instead of starting its own, so each pair has exactly one
channel. A new plan version means new channels (the old ones are dropped with the plan). While a
node loads its next stage beside the running one (make before break), it holds two managers, one
per plan version, behind one subscription of the node's handshake subject (`_HANDSHAKES`: nats-server
counts every delivery against a user's one allowed reply, so two subscriptions of the subject
left a node unable to answer any handshake while it held two managers; measured with two
subscriptions and one reply: refused). Each message goes to the managers in turn until one answers:
a manager stays silent on an offer for a plan version another manager of the node serves (and on
that offer's finish), so only the right one answers, while an offer no manager of the node serves
is refused at once. An offer is signed by
its initiator (an unsigned or forged one is refused before any KEM work), and at most
`MAX_PENDING_PER_PEER` answered offers of one peer wait for their finish (each `_PENDING_TTL_S` at
most; a peer's newer offer past its cap replaces its oldest, counted as overloaded), so no one can
fill the table for another peer; an entry is consumed only by a finish whose signature verifies,
so a bogus finish on a sniffed channel id ends nothing. Every reply is signed by the responder, a
refusal included, and the initiator reads the replies to its request until one from the node it
asked verifies (`_request`): anyone else who answers first, to refuse or to offer its own
response, is counted and ignored. Frames
name their channel by its random 16-byte id; a frame on an unknown channel, from a peer whose
certificate has since been revoked, or that fails its tag or the replay window is rejected and
counted. The revocation list is checked on every send too (`channel_to`): once the peer's serial is
on it, its channel is dropped and nothing more is sent to it (counted, reason revoked).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from nats.aio.client import NO_RESPONDERS_STATUS, Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.js.api import Header

from mohawk_common.bus import names
from mohawk_common.bus.positions import may_open
from mohawk_common.bus.security import Security
from mohawk_pqc.certificates import check_model
from mohawk_pqc.channel import FrameReceiver, FrameSender
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.handshake import ChannelKeys, HandshakeInitiator, HandshakeResponder, sign_reply, verify_reply
from mohawk_proto.v1 import security_pb2

log = structlog.get_logger("mohawk.channels")

HANDSHAKE_TIMEOUT_S = 10.0
_PENDING_TTL_S = 30.0
MAX_PENDING_PER_PEER = 4  # one peer's answered offers awaiting their finish; past it its oldest goes
_SEEN_OFFERS = 4096
_KIND_HEADER = "Mohawk-Handshake"


@dataclass
class SecureChannel:
    keys: ChannelKeys
    sender: FrameSender
    receiver: FrameReceiver

    @property
    def channel_id(self) -> bytes:
        return self.keys.channel_id

    @property
    def peer_id(self) -> str:
        return self.keys.peer.node_id


@dataclass
class _Pending:
    responder: HandshakeResponder
    peer_id: str
    started: float = field(default_factory=time.monotonic)


_MANAGERS: dict[tuple[int, str], list[ChannelManager]] = {}  # by (connection, node id): started ones
_HANDSHAKES: dict[tuple[int, str], Any] = {}  # the one subscription of each's handshake subject


def _dispatch(key: tuple[int, str]) -> Callable[[Msg], Awaitable[None]]:
    """The callback of `key`'s handshake subscription: each manager in turn, until one answers."""

    async def on_handshake(msg: Msg) -> None:
        for manager in list(_MANAGERS.get(key, [])):
            if await manager._on_handshake(msg):
                return

    return on_handshake


class ChannelManager:
    """One node's channels for one plan version; `expected_peers` maps node id -> its stage."""

    def __init__(
        self,
        nc: Client,
        security: Security,
        *,
        node_id: str,
        plan_version: int,
        expected_peers: dict[str, int],
        model: str = "",
        rotation: Callable[[bytes], FrameSender] | None = None,
    ) -> None:
        self.nc, self.security = nc, security
        self.node_id, self.plan_version, self.model = node_id, plan_version, model
        self.expected_peers = expected_peers
        self._new_sender = rotation or (lambda key: FrameSender(key))
        self._by_id: dict[bytes, SecureChannel] = {}
        self._by_peer: dict[str, SecureChannel] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._pending: dict[bytes, _Pending] = {}
        self._seen_offers: dict[bytes, None] = {}  # insertion-ordered: a replayed offer costs no KEM

    async def start(self) -> None:
        if self.security.secure:
            key = self._local_key
            _MANAGERS.setdefault(key, []).append(self)
            if key not in _HANDSHAKES:
                _HANDSHAKES[key] = None  # claimed before the await: a sibling starting meanwhile waits
                subject = names.handshakes_to(self.node_id)
                _HANDSHAKES[key] = await self.nc.subscribe(subject, cb=_dispatch(key))

    async def stop(self) -> None:
        key = self._local_key
        siblings = _MANAGERS.get(key, [])
        if self in siblings:
            siblings.remove(self)
        if not siblings:
            _MANAGERS.pop(key, None)
            sub = _HANDSHAKES.pop(key, None)
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        self._by_id.clear()
        self._by_peer.clear()

    @property
    def _local_key(self) -> tuple[int, str]:
        return id(self.nc), self.node_id

    @property
    def stage(self) -> int:
        """This node's stage in the plan (-1 when the plan does not name it)."""
        return self.stage_of(self.node_id)

    @property
    def num_stages(self) -> int:
        return max(self.expected_peers.values(), default=-1) + 1

    def stage_of(self, node_id: str) -> int:
        return self.expected_peers.get(node_id, -1)

    def _for_a_sibling(self, kind: str, data: bytes) -> bool:
        """Whether another manager of this node (another plan version) answers this message."""
        siblings = [m for m in _MANAGERS.get(self._local_key, []) if m is not self]
        if not siblings:
            return False
        try:
            if kind == "init":
                offer = security_pb2.HandshakeInit.FromString(data)
                if offer.plan_version == self.plan_version:
                    return False
                return any(m.plan_version == offer.plan_version for m in siblings)
            if kind == "finish":
                channel_id = security_pb2.HandshakeFinish.FromString(data).channel_id
                if channel_id in self._pending:
                    return False
                return any(channel_id in m._seen_offers for m in siblings)
        except Exception:
            return False  # malformed: refused by whoever handles it
        return False

    # -- peers -----------------------------------------------------------------------------------

    def _accept_peer(self, peer: security_pb2.CertificateBody, offer: security_pb2.HandshakeInit) -> None:
        if peer.role != "shard" or peer.node_id not in self.expected_peers:
            raise AuthenticationError(
                "untrusted", f"{peer.node_id!r} ({peer.role}) is not a stage of this plan"
            )
        check_model(peer, self.model)
        if offer.plan_version != self.plan_version:
            raise AuthenticationError("unknown_channel", f"offer for plan {offer.plan_version}")
        theirs, mine = self.stage_of(peer.node_id), self.stage
        if not may_open(theirs, mine, self.num_stages):
            raise AuthenticationError("out_of_position", f"stage {theirs} may not open a channel to {mine}")

    def _install(self, keys: ChannelKeys) -> SecureChannel:
        channel = SecureChannel(keys, self._new_sender(keys.send_key), FrameReceiver(keys.receive_key))
        old = self._by_peer.get(keys.peer.node_id)
        if old is not None:
            self._by_id.pop(old.channel_id, None)
        self._by_id[keys.channel_id] = channel
        self._by_peer[keys.peer.node_id] = channel
        self._waiters.setdefault(keys.peer.node_id, asyncio.Event()).set()
        log.info("channel established", peer=keys.peer.node_id, plan=self.plan_version)
        return channel

    async def channel_to(self, peer_id: str) -> SecureChannel:
        """The channel to send on to `peer_id`: handshaken here when this node's stage is lower, else
        awaited; checked against the revocation list each time (AuthenticationError, counted, when
        the peer's certificate has been revoked since: the channel is dropped and nothing is sent)."""
        channel = self._by_peer.get(peer_id)
        if channel is None:
            mine, theirs = self.stage, self.stage_of(peer_id)
            if not (may_open(mine, theirs, self.num_stages) or may_open(theirs, mine, self.num_stages)):
                exc = AuthenticationError("out_of_position", f"no channel between stages {mine} and {theirs}")
                self.security.reject(exc, peer=peer_id, what="send")
                raise exc
            if mine < theirs:
                async with self._locks.setdefault(peer_id, asyncio.Lock()):
                    channel = self._by_peer.get(peer_id)
                    if channel is None:
                        channel = await self._initiate(peer_id)
            else:
                event = self._waiters.setdefault(peer_id, asyncio.Event())
                async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                    await event.wait()
                channel = self._by_peer[peer_id]
        try:
            self._check_not_revoked(channel)
        except AuthenticationError as exc:
            self.security.reject(exc, peer=peer_id, what="send")
            raise
        return channel

    def _check_not_revoked(self, channel: SecureChannel) -> None:
        """Drop `channel` and raise when its peer's certificate is on the current revocation list."""
        if channel.keys.peer.serial not in self.security.require().trust.revoked:
            return
        self._by_id.pop(channel.channel_id, None)
        if self._by_peer.get(channel.peer_id) is channel:
            del self._by_peer[channel.peer_id]
            self._waiters.pop(channel.peer_id, None)  # a later send waits for a fresh handshake
        raise AuthenticationError("revoked", f"{channel.peer_id}'s certificate was revoked")

    async def _initiate(self, peer_id: str) -> SecureChannel:
        bundle = self.security.require()
        initiator = HandshakeInitiator(
            bundle.identity,
            bundle.trust,
            plan_version=self.plan_version,
            responder_id=peer_id,
            accept_peer=lambda peer, _offer: self._check_responder(peer, peer_id),
            kem=self.security.kem,
        )
        reply = await self._request(peer_id, "init", initiator.init_message())
        try:
            finish, keys = initiator.handle_response(reply)
        except AuthenticationError as exc:
            self.security.reject(exc, peer=peer_id, what="handshake response")
            raise
        ack = await self._request(peer_id, "finish", finish)
        if ack != b"ok":
            raise AuthenticationError("untrusted", f"{peer_id} refused the handshake finish")
        return self._install(keys)

    def _check_responder(self, peer: security_pb2.CertificateBody, peer_id: str) -> None:
        if peer.node_id != peer_id or peer.role != "shard":
            raise AuthenticationError(
                "untrusted", f"answered by {peer.node_id!r} ({peer.role}), not {peer_id!r}"
            )
        check_model(peer, self.model)

    async def _request(self, peer_id: str, kind: str, data: bytes) -> bytes:
        """Send handshake message `data` to `peer_id`; its reply, read from every answer until one
        verifies as `peer_id`'s (AuthenticationError when that one is a refusal; a timeout, as a
        NATS request's, when none comes)."""
        trust = self.security.require().trust
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        try:
            await self.nc.publish(
                names.handshake_subject(peer_id, self.node_id),
                data,
                reply=inbox,
                headers={_KIND_HEADER: kind},
            )
            deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
            while True:
                msg = await sub.next_msg(timeout=max(0.001, deadline - time.monotonic()))
                if msg.headers and msg.headers.get(Header.STATUS) == NO_RESPONDERS_STATUS:
                    raise NoRespondersError  # nobody listens on the peer's subject (yet): at once
                try:
                    reply = verify_reply(trust, data, msg.data, responder_id=peer_id, role="shard")
                except AuthenticationError as exc:
                    self.security.reject(exc, peer=peer_id, what=f"handshake {kind} reply")
                    if exc.reason in ("revoked", "expired"):  # signed by the peer's own key
                        raise
                    continue  # someone else answered: not the peer's word
                if reply.refused:
                    raise AuthenticationError("untrusted", f"handshake refused by {peer_id}")
                return reply.message
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _on_handshake(self, msg: Msg) -> bool:
        """Answer a handshake message, unless a sibling manager serves it; whether it answered."""
        kind = (msg.headers or {}).get(_KIND_HEADER, "")
        if self._for_a_sibling(kind, msg.data):
            return False
        reply = security_pb2.HandshakeReply(refused=True)
        try:
            sender = names.initiator_of(msg.subject) or ""
            reply = security_pb2.HandshakeReply(message=self._handle(kind, msg.data, sender))
        except AuthenticationError as exc:
            self.security.reject(exc, what=f"handshake {kind}")
        except Exception as exc:  # never let a peer's bytes crash the node
            self.security.reject(AuthenticationError("malformed", str(exc)), what=f"handshake {kind}")
        with contextlib.suppress(Exception):
            await msg.respond(sign_reply(self.security.require().identity, msg.data, reply))
        return True

    def _handle(self, kind: str, data: bytes, sender: str) -> bytes:
        """Answer handshake message `data` that `sender` (the subject's offering node, which only
        its own bus user may publish as) sent: an offer or finish signed as anyone else is refused."""
        bundle = self.security.require()
        now = time.monotonic()
        for stale in [cid for cid, p in self._pending.items() if now - p.started > _PENDING_TTL_S]:
            del self._pending[stale]
        if kind == "init":
            channel_id = security_pb2.HandshakeInit.FromString(data).channel_id
            if channel_id in self._seen_offers:
                raise AuthenticationError("replayed", "a handshake offer seen before")
            responder = HandshakeResponder(
                bundle.identity, bundle.trust, accept_peer=self._accept_peer, kem=self.security.kem
            )
            response = responder.respond(data)  # the offer's signature verified: its peer is known
            if responder.peer_id != sender:
                raise AuthenticationError("untrusted", f"{responder.peer_id}'s offer sent as {sender!r}")
            self._seen_offers[channel_id] = None
            while len(self._seen_offers) > _SEEN_OFFERS:
                self._seen_offers.pop(next(iter(self._seen_offers)))
            self._make_room(responder.peer_id)
            self._pending[channel_id] = _Pending(responder, responder.peer_id)
            return response
        if kind == "finish":
            channel_id = security_pb2.HandshakeFinish.FromString(data).channel_id
            pending = self._pending.get(channel_id)
            if pending is None:
                raise AuthenticationError("unknown_channel", "finish without an offer")
            if pending.peer_id != sender:
                raise AuthenticationError("untrusted", f"{pending.peer_id}'s finish sent as {sender!r}")
            keys = pending.responder.finish(data)  # a finish that fails leaves the handshake pending
            del self._pending[channel_id]
            self._install(keys)
            return b"ok"
        raise AuthenticationError("malformed", f"handshake message kind {kind!r}")

    def _make_room(self, peer_id: str) -> None:
        """Drop `peer_id`'s oldest pending offers until one more fits under its cap (counted)."""
        mine = [cid for cid, pending in self._pending.items() if pending.peer_id == peer_id]
        for channel_id in mine[: max(0, len(mine) - MAX_PENDING_PER_PEER + 1)]:
            del self._pending[channel_id]
            exc = AuthenticationError("overloaded", f"{peer_id} has {len(mine)} offers awaiting their finish")
            self.security.reject(exc, peer=peer_id, what="handshake init")

    # -- frames ----------------------------------------------------------------------------------

    def receiving(self, channel_id: bytes) -> SecureChannel:
        """The channel a frame names; AuthenticationError when none or its peer is now revoked."""
        channel = self._by_id.get(channel_id)
        if channel is None:
            raise AuthenticationError("unknown_channel", "frame on a channel no handshake made")
        self._check_not_revoked(channel)
        return channel
