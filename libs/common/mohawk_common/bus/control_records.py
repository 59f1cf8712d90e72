"""Signed control records: plans signed by the leader coordinator, heartbeats by their nodes, gateway
presence by its gateway, telemetry reports by their sender (step reports: shard nodes; request
reports: gateways).

Design. A control record travels as protobuf's canonical JSON (readable with the NATS CLI) and
carries its own `signed` field: the signer's certificate and a hybrid signature (ECDSA P-256 +
ML-DSA-65) over the record's deterministic binary encoding with `signed` cleared, under a label
per kind, so a heartbeat's signature never passes for a plan's. A reader checks, in this order:
the certificate against the operator root and the newest revocation list, the signer's role
(plans: coordinator; heartbeats: shard; presence: gateway) and id (the plan's `leader`, the
heartbeat's `node_id`, the presence's `gateway_id`),
then the signature. Every failure is one `AuthenticationError` with a reason, which the reader
counts (`Security.reject`) and then ignores the record. A certificate that verified is cached by
fingerprint until the revocation list changes or it expires, so a heartbeat costs one signature
check, not two. A process running insecure has no root to check against: it neither signs nor
verifies, as it neither encrypts nor decrypts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from mohawk_pqc.certificates import TrustStore, fingerprint
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.identity import Identity
from mohawk_pqc.signing import VerifyKey
from mohawk_proto.v1 import bus_pb2, security_pb2

RecordKind = Literal["plan", "heartbeat", "presence", "step-report", "request-report"]
Record = TypeVar("Record", bus_pb2.Plan, bus_pb2.Heartbeat, bus_pb2.GatewayPresence, bus_pb2.TelemetryReport)
AnyRecord = bus_pb2.Plan | bus_pb2.Heartbeat | bus_pb2.GatewayPresence | bus_pb2.TelemetryReport

SIGNER_ROLE: dict[RecordKind, str] = {
    "plan": "coordinator",
    "heartbeat": "shard",
    "presence": "gateway",
    "step-report": "shard",
    "request-report": "gateway",
}
MAX_CACHED_SIGNERS = 1024  # verified certificates kept (one per node or coordinator)


def _label(kind: RecordKind) -> bytes:
    return f"control-{kind}".encode()


def _signed_bytes(record: AnyRecord) -> bytes:
    unsigned = type(record)()
    unsigned.CopyFrom(record)
    unsigned.ClearField("signed")
    return unsigned.SerializeToString(deterministic=True)


def sign_record(record: Record, identity: Identity, kind: RecordKind) -> Record:
    """`record` with its `signed` field set by `identity` (in place; also returned)."""
    record.ClearField("signed")
    signature = identity.signing_key.sign(_label(kind), record.SerializeToString(deterministic=True))
    record.signed.signer.CopyFrom(identity.certificate)
    record.signed.signature.CopyFrom(signature)
    return record


def claimed_signer(record: AnyRecord, kind: RecordKind) -> str:
    """The id the record says signed it: the plan's leader, the heartbeat's node, the gateway."""
    if isinstance(record, bus_pb2.Plan):
        return record.leader
    if isinstance(record, bus_pb2.GatewayPresence):
        return record.gateway_id
    if isinstance(record, bus_pb2.TelemetryReport):
        return record.sender
    return record.node_id


@dataclass(frozen=True, slots=True)
class _Signer:
    body: security_pb2.CertificateBody
    key: VerifyKey
    crl_number: int


class RecordVerifier:
    """Verifies signed control records against one trust store; `None` trust accepts everything
    (an insecure process, which has no root to verify against)."""

    def __init__(self, trust: TrustStore | None, *, clock: Callable[[], float] = time.time) -> None:
        self.trust = trust
        self._clock = clock
        self._signers: dict[bytes, _Signer] = {}

    @property
    def enforcing(self) -> bool:
        return self.trust is not None

    def verify(self, record: AnyRecord, kind: RecordKind) -> None:
        """Return if `record` is signed by a valid certificate of the right role and id; raise
        AuthenticationError otherwise."""
        if self.trust is None:
            return
        if not record.HasField("signed"):
            raise AuthenticationError("unsigned", f"{kind} from {claimed_signer(record, kind)!r}")
        signer = self._signer(record.signed.signer, SIGNER_ROLE[kind], claimed_signer(record, kind))
        signer.key.verify(_label(kind), _signed_bytes(record), record.signed.signature)

    def _signer(self, cert: security_pb2.Certificate, role: str, node_id: str) -> _Signer:
        trust = self.trust
        if trust is None:  # pragma: no cover - verify() returns first
            raise AuthenticationError("untrusted", "no trust store")
        digest = fingerprint(cert)
        cached = self._signers.get(digest)
        now = self._clock()
        if cached is None or cached.crl_number != trust.crl_number or now > cached.body.not_after:
            body = trust.verify(cert, role=role)
            cached = _Signer(body, VerifyKey(body.ecdsa_p256_public, body.mldsa65_public), trust.crl_number)
            if len(self._signers) >= MAX_CACHED_SIGNERS:
                self._signers.clear()
            self._signers[digest] = cached
        if cached.body.role != role:
            raise AuthenticationError("untrusted", f"{cached.body.node_id} has role {cached.body.role!r}")
        if cached.body.node_id != node_id:
            raise AuthenticationError(
                "untrusted", f"certificate names {cached.body.node_id!r}, the record {node_id!r}"
            )
        return cached
