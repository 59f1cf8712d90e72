"""Operator PKI: a root that signs node certificates and revocation lists, and the checks on both.

A certificate binds a node id and role to the node's signing keys (hybrid ECDSA P-256 + ML-DSA-65)
and its static KEM keys (X25519 + ML-KEM-768), with a serial and a validity window; the root signs
the serialized body. `TrustStore.verify` accepts a certificate only when the root's hybrid
signature verifies, the issuer is that root, the time lies in the window and the serial is not
revoked. A node certificate may name the one served model its node serves (`check_model`; one that
names none, as every certificate issued before models were bound, serves any). Revocation lists
are signed by the root and numbered; a store keeps the highest-numbered
valid list it has seen, so withholding or replaying an older list cannot un-revoke anyone.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.signing import SigningKey, VerifyKey
from mohawk_proto.v1 import security_pb2

CERT_FORMAT = 1
ROLES = ("shard", "gateway", "coordinator", "seal")
_CERT_LABEL = b"certificate"
_CRL_LABEL = b"revocation-list"

Clock = Callable[[], float]


@dataclass(frozen=True)
class Root:
    """The operator root's public keys, and the issuer id derived from them."""

    public: security_pb2.RootPublicKey

    @property
    def issuer(self) -> bytes:
        return hashlib.sha256(self.public.SerializeToString(deterministic=True)).digest()

    @property
    def verify_key(self) -> VerifyKey:
        return VerifyKey(self.public.ecdsa_p256_public, self.public.mldsa65_public)


def root_public(key: SigningKey) -> security_pb2.RootPublicKey:
    verify = key.verify_key()
    return security_pb2.RootPublicKey(
        ecdsa_p256_public=verify.ecdsa_public, mldsa65_public=verify.mldsa_public
    )


def issue_certificate(root_key: SigningKey, body: security_pb2.CertificateBody) -> security_pb2.Certificate:
    """Sign `body` (its issuer is set here) with the root key."""
    body.format = CERT_FORMAT
    body.issuer = Root(root_public(root_key)).issuer
    data = body.SerializeToString(deterministic=True)
    return security_pb2.Certificate(body=data, signature=root_key.sign(_CERT_LABEL, data))


def sign_revocation_list(
    root_key: SigningKey, number: int, serials: Iterable[int], now: float
) -> security_pb2.RevocationList:
    body = security_pb2.RevocationListBody(
        number=number, serials=sorted(set(serials)), issued_at=now, issuer=Root(root_public(root_key)).issuer
    )
    data = body.SerializeToString(deterministic=True)
    return security_pb2.RevocationList(body=data, signature=root_key.sign(_CRL_LABEL, data))


def read_body(cert: security_pb2.Certificate) -> security_pb2.CertificateBody:
    """The body of a certificate, unverified (for display and lookups only)."""
    try:
        return security_pb2.CertificateBody.FromString(cert.body)
    except DecodeError as exc:
        raise AuthenticationError("malformed", "certificate body") from exc


def fingerprint(cert: security_pb2.Certificate) -> bytes:
    return hashlib.sha256(cert.SerializeToString(deterministic=True)).digest()


class TrustStore:
    """Verifies certificates against one root and the newest revocation list it has accepted."""

    def __init__(self, root: Root, *, clock: Clock = time.time) -> None:
        self.root = root
        self._clock = clock
        self._verify_key = root.verify_key
        self.crl_number = 0
        self.revoked: frozenset[int] = frozenset()

    def update_revocations(self, crl: security_pb2.RevocationList) -> bool:
        """Adopt `crl` if it is the root's and newer than the one held; True when adopted."""
        self._verify_key.verify(_CRL_LABEL, crl.body, crl.signature)
        body = security_pb2.RevocationListBody.FromString(crl.body)
        if body.issuer != self.root.issuer:
            raise AuthenticationError("untrusted", "revocation list from another root")
        if body.number <= self.crl_number:
            return False
        self.crl_number, self.revoked = body.number, frozenset(body.serials)
        return True

    def verify(
        self,
        cert: security_pb2.Certificate,
        *,
        role: str | Iterable[str] | None = None,
        node_id: str | None = None,
    ) -> security_pb2.CertificateBody:
        """The body of a valid certificate (optionally of `role` and `node_id`); else AuthenticationError."""
        self._verify_key.verify(_CERT_LABEL, cert.body, cert.signature)
        body = read_body(cert)
        if body.format != CERT_FORMAT or body.issuer != self.root.issuer:
            raise AuthenticationError("untrusted", "certificate from another root or format")
        now = self._clock()
        if not body.not_before <= now <= body.not_after:
            raise AuthenticationError("expired", f"certificate {body.serial} of {body.node_id}")
        if body.serial in self.revoked:
            raise AuthenticationError("revoked", f"certificate {body.serial} of {body.node_id}")
        roles = (role,) if isinstance(role, str) else role
        if roles is not None and body.role not in roles:
            raise AuthenticationError("untrusted", f"{body.node_id} has role {body.role!r}")
        if node_id is not None and body.node_id != node_id:
            raise AuthenticationError("untrusted", f"certificate names {body.node_id!r}, not {node_id!r}")
        return body


def check_model(body: security_pb2.CertificateBody, model: str) -> None:
    """AuthenticationError (untrusted) when the certificate is bound to a served model other than
    `model`. A certificate naming no model (issued before certificates were bound to models, or for
    a node of several models) serves any, and an empty `model` asks for none."""
    if body.model and model and body.model != model:
        raise AuthenticationError(
            "untrusted", f"{body.node_id}'s certificate is for model {body.model!r}, not {model!r}"
        )
