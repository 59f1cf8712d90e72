"""The channel handshake: ephemeral X25519 + ML-KEM-768, both sides sign the transcript (SIGMA-style).

    1. initiator -> responder  HandshakeInit: suites offered, channel id, plan version, its
       certificate, ephemeral X25519 key, ephemeral ML-KEM-768 encapsulation key, and its
       signature over all of that (so an offer from anyone without a certified key costs the
       responder one signature check, no KEM work and no pending state).
    2. responder -> initiator  HandshakeResponse: its certificate, ephemeral X25519 key, an ML-KEM
       ciphertext encapsulated to the initiator's key, and its signature over
       T1 = H(init || response-without-signature).
    3. initiator -> responder  HandshakeFinish: its signature over T2 = H(T1 || responder signature).

Both sides check the peer's certificate against the operator root and the revocation list, and that
it is the node the plan puts at the other end (the caller's `accept_peer`). Keys =
HKDF-SHA256(ss_x25519 || ss_mlkem, salt = T1), one per direction (`keyschedule.channel_keys`). A
responder refuses an offer without the hybrid suite or without an ML-KEM key: there is no
classical-only fallback to downgrade to. The responder installs the channel only after message 3
verifies, so an unauthenticated initiator never gets a channel; a message 3 that fails leaves the
handshake pending, so whoever sniffed the channel id cannot end it with a bogus finish. Every reply
the responder sends, a refusal included, carries its certificate and its signature over the request
and the reply (`sign_reply` / `verify_reply`): whoever else can answer on the responder's subject
cannot refuse a handshake on its behalf. Randomness (ephemeral keys, the channel id) and the clock
are injectable for known-answer tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from cryptography.hazmat.primitives.asymmetric import x25519
from google.protobuf.message import DecodeError, Message

from mohawk_pqc.certificates import TrustStore, read_body
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.identity import Identity
from mohawk_pqc.kem import MLKEM768_CIPHERTEXT_BYTES, MLKEM768_PUBLIC_BYTES, KemDecapsulator, KemProvider
from mohawk_pqc.keyschedule import SUITE, channel_keys, transcript_hash
from mohawk_pqc.signing import VerifyKey
from mohawk_proto.v1 import security_pb2

M = TypeVar("M", bound=Message)

HANDSHAKE_VERSION = 1
MAX_CLOCK_SKEW_S = 120.0
_INIT_LABEL = b"handshake-init"
_RESPONSE_LABEL = b"handshake-response"
_FINISH_LABEL = b"handshake-finish"
_REPLY_LABEL = b"handshake-reply"

_Pending = tuple[security_pb2.HandshakeInit, security_pb2.CertificateBody, bytes, bytes, bytes]
AcceptPeer = Callable[[security_pb2.CertificateBody, security_pb2.HandshakeInit], None]


@dataclass(frozen=True)
class ChannelKeys:
    """What a finished handshake gives one side."""

    channel_id: bytes
    send_key: bytes
    receive_key: bytes
    peer: security_pb2.CertificateBody
    plan_version: int


def _parse(cls: type[M], data: bytes) -> M:
    try:
        return cls.FromString(data)
    except DecodeError as exc:
        raise AuthenticationError("malformed", f"{cls.__name__}") from exc


def _unsigned_bytes(message: Message) -> bytes:
    """`message` as it was signed: its deterministic encoding without its `signature` field."""
    unsigned = type(message)()
    unsigned.CopyFrom(message)
    unsigned.ClearField("signature")
    return unsigned.SerializeToString(deterministic=True)


def _verify_key(body: security_pb2.CertificateBody) -> VerifyKey:
    return VerifyKey(body.ecdsa_p256_public, body.mldsa65_public)


def _x25519_public(data: bytes) -> x25519.X25519PublicKey:
    try:
        return x25519.X25519PublicKey.from_public_bytes(data)
    except ValueError as exc:
        raise AuthenticationError("malformed", "X25519 key") from exc


class HandshakeInitiator:
    def __init__(
        self,
        identity: Identity,
        trust: TrustStore,
        *,
        plan_version: int,
        responder_id: str,
        accept_peer: AcceptPeer,
        kem: KemProvider,
        channel_id: bytes | None = None,
        ephemeral_x25519: x25519.X25519PrivateKey | None = None,
        ephemeral_kem: KemDecapsulator | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._identity, self._trust, self._accept = identity, trust, accept_peer
        self._x25519 = ephemeral_x25519 or x25519.X25519PrivateKey.generate()
        self._kem = ephemeral_kem or kem.generate()
        self._init = security_pb2.HandshakeInit(
            version=HANDSHAKE_VERSION,
            suites=[SUITE],
            channel_id=channel_id or os.urandom(16),
            plan_version=plan_version,
            certificate=identity.certificate,
            x25519_public=self._x25519.public_key().public_bytes_raw(),
            mlkem768_public=self._kem.public_bytes,
            responder_id=responder_id,
            sent_at=clock(),
        )
        unsigned = self._init.SerializeToString(deterministic=True)
        self._init.signature.CopyFrom(identity.signing_key.sign(_INIT_LABEL, transcript_hash(unsigned)))
        self._init_bytes = self._init.SerializeToString(deterministic=True)

    @property
    def channel_id(self) -> bytes:
        return self._init.channel_id

    def init_message(self) -> bytes:
        return self._init_bytes

    def handle_response(self, data: bytes) -> tuple[bytes, ChannelKeys]:
        """Verify message 2; return message 3 and the channel keys (initiator's view)."""
        response = _parse(security_pb2.HandshakeResponse, data)
        if response.suite != SUITE or len(response.mlkem768_ciphertext) != MLKEM768_CIPHERTEXT_BYTES:
            raise AuthenticationError("downgrade", f"responder chose {response.suite!r}")
        # the node we meant to reach, not merely some certified node (accept_peer may check only roles)
        peer = self._trust.verify(response.certificate, node_id=self._init.responder_id)
        self._accept(peer, self._init)
        signature = response.signature
        t1 = transcript_hash(self._init_bytes, _unsigned_bytes(response))
        _verify_key(peer).verify(_RESPONSE_LABEL, t1, signature)
        ss_x = self._x25519.exchange(_x25519_public(response.x25519_public))
        ss_k = self._kem.decapsulate(response.mlkem768_ciphertext)
        to_responder, to_initiator = channel_keys(ss_x, ss_k, t1, self.channel_id)
        t2 = transcript_hash(t1, signature.SerializeToString(deterministic=True))
        finish = security_pb2.HandshakeFinish(
            channel_id=self.channel_id, signature=self._identity.signing_key.sign(_FINISH_LABEL, t2)
        )
        keys = ChannelKeys(self.channel_id, to_responder, to_initiator, peer, self._init.plan_version)
        return finish.SerializeToString(), keys


class HandshakeResponder:
    """One handshake's responder side: `respond` to message 1, then `finish` on message 3."""

    def __init__(
        self,
        identity: Identity,
        trust: TrustStore,
        *,
        accept_peer: AcceptPeer,
        kem: KemProvider,
        ephemeral_x25519: x25519.X25519PrivateKey | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._identity, self._trust, self._accept, self._kem = identity, trust, accept_peer, kem
        self._x25519 = ephemeral_x25519 or x25519.X25519PrivateKey.generate()
        self._clock = clock
        self._pending: (
            tuple[security_pb2.HandshakeInit, security_pb2.CertificateBody, bytes, bytes, bytes] | None
        )
        self._pending = None

    @property
    def peer_id(self) -> str:
        """The node whose offer `respond` accepted (its certificate and signature verified)."""
        if self._pending is None:
            raise AuthenticationError("unknown_channel", "no offer accepted")
        return self._pending[1].node_id

    def respond(self, data: bytes) -> bytes:
        init = _parse(security_pb2.HandshakeInit, data)
        if SUITE not in init.suites or len(init.mlkem768_public) != MLKEM768_PUBLIC_BYTES:
            raise AuthenticationError("downgrade", f"offered {list(init.suites)}")
        if init.version != HANDSHAKE_VERSION or len(init.channel_id) != 16:
            raise AuthenticationError("malformed", "handshake version or channel id")
        if abs(self._clock() - init.sent_at) > MAX_CLOCK_SKEW_S:
            raise AuthenticationError("replayed", "handshake offer too old or from the future")
        if init.responder_id != self._identity.node_id:
            raise AuthenticationError("untrusted", f"offer meant for {init.responder_id!r}")
        peer = self._trust.verify(init.certificate)
        if not init.HasField("signature"):
            raise AuthenticationError("unsigned", f"handshake offer from {peer.node_id!r}")
        _verify_key(peer).verify(_INIT_LABEL, transcript_hash(_unsigned_bytes(init)), init.signature)
        self._accept(peer, init)
        ss_x = self._x25519.exchange(_x25519_public(init.x25519_public))
        try:  # FIPS 203 checks the encapsulation key: every 12-bit coefficient below q
            ss_k, ciphertext = self._kem.encapsulate(init.mlkem768_public)
        except ValueError as exc:
            raise AuthenticationError("malformed", "ML-KEM-768 encapsulation key") from exc
        response = security_pb2.HandshakeResponse(
            suite=SUITE,
            certificate=self._identity.certificate,
            x25519_public=self._x25519.public_key().public_bytes_raw(),
            mlkem768_ciphertext=ciphertext,
        )
        t1 = transcript_hash(data, response.SerializeToString(deterministic=True))
        response.signature.CopyFrom(self._identity.signing_key.sign(_RESPONSE_LABEL, t1))
        self._pending = (init, peer, t1, ss_x, ss_k)
        self._signature = response.signature.SerializeToString(deterministic=True)
        return response.SerializeToString(deterministic=True)

    def finish(self, data: bytes) -> ChannelKeys:
        """Verify message 3; the channel keys (responder's view)."""
        if self._pending is None:
            raise AuthenticationError("unknown_channel", "finish before an offer")
        init, peer, t1, ss_x, ss_k = self._pending
        finish = _parse(security_pb2.HandshakeFinish, data)
        if finish.channel_id != init.channel_id:
            raise AuthenticationError("unknown_channel", "finish for another channel")
        t2 = transcript_hash(t1, self._signature)
        _verify_key(peer).verify(_FINISH_LABEL, t2, finish.signature)
        # consumed only now: a bogus finish (the channel id is visible on the wire) cannot end it
        self._pending = None
        to_responder, to_initiator = channel_keys(ss_x, ss_k, t1, init.channel_id)
        return ChannelKeys(init.channel_id, to_initiator, to_responder, peer, init.plan_version)


def sign_reply(identity: Identity, request: bytes, reply: security_pb2.HandshakeReply) -> bytes:
    """`reply` to the handshake message `request`, with this node's certificate and signature."""
    reply.certificate.CopyFrom(identity.certificate)
    digest = transcript_hash(request, _unsigned_bytes(reply))
    reply.signature.CopyFrom(identity.signing_key.sign(_REPLY_LABEL, digest))
    return reply.SerializeToString(deterministic=True)


def verify_reply(
    trust: TrustStore, request: bytes, data: bytes, *, responder_id: str, role: str | None = None
) -> security_pb2.HandshakeReply:
    """The reply in `data` to `request` when node `responder_id` (of `role`) signed it;
    AuthenticationError otherwise (anyone on the bus may answer a request; only the node asked
    may refuse it)."""
    reply = _parse(security_pb2.HandshakeReply, data)
    if not reply.HasField("signature"):
        raise AuthenticationError("unsigned", f"handshake reply claiming to be {responder_id!r}")
    claimed = read_body(reply.certificate)
    if claimed.node_id != responder_id:
        raise AuthenticationError("untrusted", f"reply from {claimed.node_id!r}, not {responder_id!r}")
    digest = transcript_hash(request, _unsigned_bytes(reply))
    # the signature first: a certificate's standing (revoked, expired) is news only from its key
    _verify_key(claimed).verify(_REPLY_LABEL, digest, reply.signature)
    trust.verify(reply.certificate, role=role, node_id=responder_id)
    return reply
