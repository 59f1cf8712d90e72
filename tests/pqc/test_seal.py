"""Sealed envelopes open only for their recipient and context; event boxes only for their request."""

from __future__ import annotations

import os

import pytest

from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.identity import Identity
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.seal import EventBox, open_sealed, seal
from mohawk_proto.v1 import security_pb2
from tests.pqc.helpers import ScratchPki, flip

KEM = CryptographyKem()
AAD = b"mohawk/v1 request req-1 model smollm2"
SECRET = b"a prompt nobody on the bus may read"


@pytest.fixture
def recipient(pki: ScratchPki) -> Identity:
    return pki.identity("seal-smollm2", "seal", model="smollm2")


@pytest.fixture
def envelope(recipient: Identity) -> security_pb2.SealedEnvelope:
    return seal(recipient.body, SECRET, AAD, KEM)


def test_a_sealed_envelope_opens_for_its_recipient(
    recipient: Identity, envelope: security_pb2.SealedEnvelope
) -> None:
    assert open_sealed(recipient.kem_keys, envelope, AAD) == SECRET
    assert envelope.recipient_serial == recipient.body.serial
    assert SECRET not in envelope.SerializeToString()


def test_each_seal_is_fresh(recipient: Identity, envelope: security_pb2.SealedEnvelope) -> None:
    again = seal(recipient.body, SECRET, AAD, KEM)
    assert again.x25519_public != envelope.x25519_public
    assert again.mlkem768_ciphertext != envelope.mlkem768_ciphertext
    assert again.ciphertext != envelope.ciphertext


def test_the_wrong_recipient_cannot_open(pki: ScratchPki, envelope: security_pb2.SealedEnvelope) -> None:
    other = pki.identity("seal-other", "seal", model="other")
    with pytest.raises(AuthenticationError):
        open_sealed(other.kem_keys, envelope, AAD)


@pytest.mark.parametrize("aad", [b"", AAD + b"x", AAD.replace(b"req-1", b"req-2")])
def test_a_changed_context_cannot_open(
    recipient: Identity, envelope: security_pb2.SealedEnvelope, aad: bytes
) -> None:
    with pytest.raises(AuthenticationError) as caught:
        open_sealed(recipient.kem_keys, envelope, aad)
    assert caught.value.reason == "tampered"


@pytest.mark.parametrize(
    ("field", "index"),
    [("ciphertext", 0), ("ciphertext", -1), ("nonce", 3), ("x25519_public", 0), ("mlkem768_ciphertext", 700)],
)
def test_a_flipped_bit_anywhere_cannot_open(
    recipient: Identity, envelope: security_pb2.SealedEnvelope, field: str, index: int
) -> None:
    bad = security_pb2.SealedEnvelope()
    bad.CopyFrom(envelope)
    setattr(bad, field, flip(getattr(envelope, field), index))
    with pytest.raises(AuthenticationError) as caught:
        open_sealed(recipient.kem_keys, bad, AAD)
    assert caught.value.reason == "tampered"


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("version", 2, "bad_version"),
        ("mlkem768_ciphertext", b"short", "malformed"),
        ("x25519_public", b"short", "malformed"),
    ],
)
def test_a_malformed_envelope_is_refused(
    recipient: Identity, envelope: security_pb2.SealedEnvelope, field: str, value: object, reason: str
) -> None:
    bad = security_pb2.SealedEnvelope()
    bad.CopyFrom(envelope)
    setattr(bad, field, value)
    with pytest.raises(AuthenticationError) as caught:
        open_sealed(recipient.kem_keys, bad, AAD)
    assert caught.value.reason == reason


def test_event_box_round_trip() -> None:
    key = os.urandom(32)
    sealed = EventBox(key, "req-1").seal(b"token 42")
    assert b"token 42" not in sealed
    assert EventBox(key, "req-1").open(sealed) == b"token 42"


def test_an_event_box_of_another_request_cannot_open() -> None:
    key = os.urandom(32)
    sealed = EventBox(key, "req-1").seal(b"token 42")
    with pytest.raises(AuthenticationError) as caught:
        EventBox(key, "req-2").open(sealed)
    assert caught.value.reason == "tampered"


@pytest.mark.parametrize("damage", ["key", "ciphertext", "garbage"])
def test_an_event_box_refuses_what_it_did_not_seal(damage: str) -> None:
    key = os.urandom(32)
    sealed = EventBox(key, "req-1").seal(b"token 42")
    box = EventBox(os.urandom(32) if damage == "key" else key, "req-1")
    data = {"key": sealed, "ciphertext": flip(sealed), "garbage": b"\xff\x01"}[damage]
    with pytest.raises(AuthenticationError):
        box.open(data)


def test_an_event_box_wants_a_32_byte_key() -> None:
    with pytest.raises(AuthenticationError):
        EventBox(b"short", "req-1")
