"""Helpers for libs/pqc tests: a throwaway operator PKI, an injectable clock, bit flips."""

from __future__ import annotations

from collections.abc import Iterable

from mohawk_pqc.certificates import Root, TrustStore, issue_certificate, root_public, sign_revocation_list
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.handshake import AcceptPeer
from mohawk_pqc.identity import Identity, KemKeyPair, certificate_body_for
from mohawk_pqc.signing import SigningKey
from mohawk_proto.v1 import security_pb2

NOW = 1_750_000_000.0  # every test clock starts here
DAY_S = 86400.0


class Clock:
    """An injectable clock the test moves by hand."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class ScratchPki:
    """One root; issues identities and builds trust stores bound to a shared clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.root_key = SigningKey.generate()
        self.root = Root(root_public(self.root_key))
        self._next_serial = 100

    def identity(
        self,
        node_id: str,
        role: str = "shard",
        *,
        not_before: float = NOW - DAY_S,
        not_after: float = NOW + DAY_S,
        model: str = "",
    ) -> Identity:
        signing, kem = SigningKey.generate(), KemKeyPair.generate()
        self._next_serial += 1
        body = certificate_body_for(
            node_id,
            role,
            signing,
            kem,
            serial=self._next_serial,
            not_before=not_before,
            not_after=not_after,
            model=model,
        )
        return Identity(issue_certificate(self.root_key, body), signing, kem)

    def trust(self) -> TrustStore:
        return TrustStore(self.root, clock=self.clock)

    def crl(self, number: int, serials: Iterable[int]) -> security_pb2.RevocationList:
        return sign_revocation_list(self.root_key, number, serials, self.clock())


def expect_peer(node_id: str, role: str) -> AcceptPeer:
    """What the plan says sits at the other end; anything else is refused."""

    def accept(peer: security_pb2.CertificateBody, init: security_pb2.HandshakeInit) -> None:
        if peer.node_id != node_id or peer.role != role:
            raise AuthenticationError("untrusted", f"expected {role} {node_id}, got {peer.node_id}")

    return accept


def accept_any(peer: security_pb2.CertificateBody, init: security_pb2.HandshakeInit) -> None:
    """A careless caller that checks nothing itself (the library's own checks must hold)."""


def flip(data: bytes, index: int = -1) -> bytes:
    """`data` with one bit of byte `index` flipped."""
    out = bytearray(data)
    out[index] ^= 0x01
    return bytes(out)
