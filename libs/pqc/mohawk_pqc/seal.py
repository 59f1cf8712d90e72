"""Sealed envelopes (one-shot hybrid public-key encryption) and per-request event boxes.

`seal` encrypts to a holder of static X25519 + ML-KEM-768 keys, as HPKE's base mode does with one
KEM: a fresh X25519 key agreement and a fresh ML-KEM encapsulation give two shared secrets, HKDF
turns them (salted with every public value involved) into an AES-256-GCM key, and the caller's
associated data binds the envelope to its context (request id, model, slice). Only the holder of
the recipient's private keys can open it. Requests on the durable stream are sealed to the model's
request-sealing key, which the operator gives to the model's shard nodes only; slice weights are
sealed to the one node that will load them.

`EventBox` encrypts a request's token events with the 32-byte key the gateway put inside that
request, with random 96-bit nonces (a request has far fewer than 2^32 events).
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric import x25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.message import DecodeError

from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.identity import KemKeyPair
from mohawk_pqc.kem import KemProvider
from mohawk_pqc.keyschedule import seal_key
from mohawk_proto.v1 import security_pb2

ENVELOPE_VERSION = 1


def seal(
    body: security_pb2.CertificateBody, plaintext: bytes, aad: bytes, kem: KemProvider
) -> security_pb2.SealedEnvelope:
    """Encrypt `plaintext` to the static KEM keys certified in `body`."""
    ephemeral = x25519.X25519PrivateKey.generate()
    eph_public = ephemeral.public_key().public_bytes_raw()
    ss_x = ephemeral.exchange(x25519.X25519PublicKey.from_public_bytes(body.x25519_public))
    ss_k, ciphertext = kem.encapsulate(body.mlkem768_public)
    key = seal_key(ss_x, ss_k, eph_public, ciphertext, body.x25519_public, body.mlkem768_public)
    nonce = os.urandom(12)
    return security_pb2.SealedEnvelope(
        version=ENVELOPE_VERSION,
        recipient_serial=body.serial,
        x25519_public=eph_public,
        mlkem768_ciphertext=ciphertext,
        nonce=nonce,
        ciphertext=AESGCM(key).encrypt(nonce, plaintext, aad),
    )


def open_sealed(keys: KemKeyPair, envelope: security_pb2.SealedEnvelope, aad: bytes) -> bytes:
    """The plaintext; AuthenticationError for anything that was not sealed to `keys` under `aad`."""
    if envelope.version != ENVELOPE_VERSION:
        raise AuthenticationError("bad_version", f"envelope version {envelope.version}")
    try:
        peer = x25519.X25519PublicKey.from_public_bytes(envelope.x25519_public)
        ss_x = keys.x25519.exchange(peer)
        ss_k = keys.mlkem.decapsulate(envelope.mlkem768_ciphertext)
    except ValueError as exc:
        raise AuthenticationError("malformed", "envelope keys") from exc
    key = seal_key(
        ss_x,
        ss_k,
        envelope.x25519_public,
        envelope.mlkem768_ciphertext,
        keys.x25519_public,
        keys.mlkem_public,
    )
    try:
        return AESGCM(key).decrypt(envelope.nonce, envelope.ciphertext, aad)
    except (InvalidTag, ValueError) as exc:
        raise AuthenticationError("tampered", "envelope failed its tag") from exc


class EventBox:
    """AES-256-GCM under one request's token key; the request id is the associated data."""

    def __init__(self, key: bytes, request_id: str) -> None:
        if len(key) != 32:
            raise AuthenticationError("malformed", "token key must be 32 bytes")
        self._aead = AESGCM(key)
        self._aad = b"mohawk/v1 token " + request_id.encode()

    def seal(self, plaintext: bytes) -> bytes:
        nonce = os.urandom(12)
        event = security_pb2.SealedEvent(
            nonce=nonce, ciphertext=self._aead.encrypt(nonce, plaintext, self._aad)
        )
        return event.SerializeToString()

    def open(self, data: bytes) -> bytes:
        try:
            event = security_pb2.SealedEvent.FromString(data)
            return self._aead.decrypt(event.nonce, event.ciphertext, self._aad)
        except (DecodeError, InvalidTag, ValueError) as exc:
            raise AuthenticationError("tampered", "token event failed its tag") from exc
