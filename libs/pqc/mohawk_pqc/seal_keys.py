"""Sealing-key records: a model's request-sealing key, rotated by the operator, carried to its nodes.

Design. Requests on the durable stream are sealed to one key per model, held by the model's shard
nodes. When a node is revoked the operator makes a new key and signs a `SealKeyRecord`: the new
sealing certificate, the new private key sealed (`mohawk_pqc.seal`, X25519 + ML-KEM-768) to the
static KEM keys of each shard node that may keep it, and a number that grows with every rotation
of that model's key. A revoked node is simply not a recipient, so it cannot open what gateways seal
after the rotation. A process checks, in this order: the root's signature over the whole record,
the issuer and format, the sealing certificate (root, role seal, this model), the number (a lower
one is a replay), then, where it opens requests, its own copy. Each copy is sealed with the model,
the number and the certificate's serial as associated data, so it cannot be moved into another
record. `SealKeyring` is what a process holds per model: the newest certificate (gateways seal
to it), the newest private key and the one before it, kept only until every request sealed to that
one has lived out its life, then dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from mohawk_pqc.certificates import Root, TrustStore, read_body, root_public
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.identity import Identity, KemKeyPair
from mohawk_pqc.kem import KemProvider
from mohawk_pqc.seal import open_sealed, seal
from mohawk_pqc.signing import SigningKey
from mohawk_proto.v1 import security_pb2

RECORD_FORMAT = 1
_RECORD_LABEL = b"seal-key-record"


def _copy_aad(model: str, number: int, seal_serial: int) -> bytes:
    return f"mohawk/v1 seal-key {model} {number} {seal_serial}".encode()


def sign_seal_key_record(
    root_key: SigningKey,
    seal_key: Identity,
    recipients: Iterable[security_pb2.CertificateBody],
    kem: KemProvider,
    *,
    number: int,
    now: float,
) -> security_pb2.SealKeyRecord:
    """The record of `seal_key` (a certified sealing key pair) as number `number`, its private KEM
    keys sealed to each of `recipients` (shard certificates the caller has checked)."""
    cert_body = seal_key.body
    private = security_pb2.PrivateKeyBundle(
        x25519_private=seal_key.kem_keys.x25519_raw, mlkem768_seed=seal_key.kem_keys.mlkem_seed
    ).SerializeToString(deterministic=True)
    aad = _copy_aad(cert_body.model, number, cert_body.serial)
    body = security_pb2.SealKeyRecordBody(
        format=RECORD_FORMAT,
        number=number,
        model=cert_body.model,
        certificate=seal_key.certificate,
        copies=[seal(recipient, private, aad, kem) for recipient in recipients],
        issued_at=now,
        issuer=Root(root_public(root_key)).issuer,
    )
    data = body.SerializeToString(deterministic=True)
    return security_pb2.SealKeyRecord(body=data, signature=root_key.sign(_RECORD_LABEL, data))


def verify_seal_key_record(
    record: security_pb2.SealKeyRecord, trust: TrustStore
) -> security_pb2.SealKeyRecordBody:
    """The body of a record the root signed, whose sealing certificate is valid for its model."""
    trust.root.verify_key.verify(_RECORD_LABEL, record.body, record.signature)
    try:
        body = security_pb2.SealKeyRecordBody.FromString(record.body)
    except DecodeError as exc:
        raise AuthenticationError("malformed", "sealing-key record body") from exc
    if body.format != RECORD_FORMAT or body.issuer != trust.root.issuer:
        raise AuthenticationError("untrusted", "sealing-key record from another root or format")
    certified = trust.verify(body.certificate, role="seal")
    if certified.model != body.model:
        raise AuthenticationError(
            "untrusted", f"sealing certificate of {certified.model!r} in a record of {body.model!r}"
        )
    return body


def open_seal_key_copy(body: security_pb2.SealKeyRecordBody, identity: Identity) -> KemKeyPair:
    """This node's copy of the record's private key; AuthenticationError when the record holds none
    for it (a revoked node, or one the operator did not issue the key to) or the copy is not the
    certified key."""
    serial = identity.body.serial
    copies = [copy for copy in body.copies if copy.recipient_serial == serial]
    if not copies:
        raise AuthenticationError(
            "untrusted", f"sealing-key record {body.number} has no copy for {identity.node_id}"
        )
    certified = read_body(body.certificate)
    plaintext = open_sealed(
        identity.kem_keys, copies[0], _copy_aad(body.model, body.number, certified.serial)
    )
    try:
        private = security_pb2.PrivateKeyBundle.FromString(plaintext)
        pair = KemKeyPair.from_private_bytes(private.x25519_private, private.mlkem768_seed)
    except (DecodeError, ValueError) as exc:
        raise AuthenticationError("malformed", "sealing key in its record") from exc
    if (pair.x25519_public, pair.mlkem_public) != (certified.x25519_public, certified.mlkem768_public):
        raise AuthenticationError("tampered", "the sealed key is not the certified one")
    return pair


@dataclass(frozen=True)
class RetiredSealKey:
    """A rotated-out private key, still opening requests sealed to it until `until`."""

    serial: int
    keys: KemKeyPair
    until: float


class SealKeyring:
    """One model's request-sealing key as a process holds it: the newest certificate, the newest
    private key (shard nodes only) and the previous one until its requests can no longer live."""

    def __init__(
        self, certificate: security_pb2.Certificate, keys: KemKeyPair | None, number: int = 0
    ) -> None:
        self.certificate = certificate
        self.keys = keys
        self.number = number  # of the record it came from; 0 for the bundle's own files
        self.previous: RetiredSealKey | None = None

    @property
    def serial(self) -> int:
        return read_body(self.certificate).serial

    def key_for(self, serial: int, now: float) -> KemKeyPair | None:
        """The private key of sealing certificate `serial`, if held: the newest, or the previous one
        until it lapses (then it is dropped)."""
        previous = self.previous  # one read: a gateway seals from a worker thread
        if previous is not None and now > previous.until:
            self.previous = previous = None
        if serial == self.serial:
            return self.keys
        if previous is not None and previous.serial == serial:
            return previous.keys
        return None

    def is_newer(self, body: security_pb2.SealKeyRecordBody) -> bool:
        """False for the record held now (a watch delivers it again); AuthenticationError (replayed)
        for an older one."""
        if body.number < self.number:
            raise AuthenticationError("replayed", f"sealing-key record {body.number} after {self.number}")
        return body.number > self.number

    def adopt(
        self, body: security_pb2.SealKeyRecordBody, keys: KemKeyPair | None, *, now: float, keep_s: float
    ) -> None:
        """Take the record's certificate and private key; the key it replaces opens for `keep_s` more."""
        if self.keys is not None and read_body(body.certificate).serial != self.serial:
            self.previous = RetiredSealKey(self.serial, self.keys, now + keep_s)
        self.certificate, self.keys, self.number = body.certificate, keys, body.number
