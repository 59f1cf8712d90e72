"""Hybrid signatures: valid only when both ECDSA P-256 and ML-DSA-65 verify, for the same label."""

from __future__ import annotations

import pytest

from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.signing import SigningKey, VerifyKey
from mohawk_proto.v1 import security_pb2
from tests.pqc.helpers import flip

LABEL = b"certificate"
MESSAGE = b"the bytes a root vouches for"


@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture(scope="module")
def signature(key: SigningKey) -> security_pb2.HybridSignature:
    return key.sign(LABEL, MESSAGE)


def test_a_signature_verifies(key: SigningKey, signature: security_pb2.HybridSignature) -> None:
    key.verify_key().verify(LABEL, MESSAGE, signature)


def test_the_private_key_round_trips_through_its_bytes(key: SigningKey) -> None:
    again = SigningKey.from_private_bytes(key.ecdsa_pkcs8, key.mldsa_seed)
    key.verify_key().verify(LABEL, MESSAGE, again.sign(LABEL, MESSAGE))
    assert again.verify_key().mldsa_public == key.verify_key().mldsa_public


@pytest.mark.parametrize("half", ["ecdsa_p256", "mldsa65"])
@pytest.mark.parametrize("index", [0, 9, -1])
def test_one_flipped_byte_in_either_half_fails(
    key: SigningKey, signature: security_pb2.HybridSignature, half: str, index: int
) -> None:
    bad = security_pb2.HybridSignature()
    bad.CopyFrom(signature)
    setattr(bad, half, flip(getattr(signature, half), index))
    with pytest.raises(AuthenticationError) as caught:
        key.verify_key().verify(LABEL, MESSAGE, bad)
    assert caught.value.reason == "tampered"


@pytest.mark.parametrize("half", ["ecdsa_p256", "mldsa65"])
def test_a_missing_half_fails(key: SigningKey, signature: security_pb2.HybridSignature, half: str) -> None:
    bad = security_pb2.HybridSignature()
    bad.CopyFrom(signature)
    bad.ClearField(half)
    with pytest.raises(AuthenticationError):
        key.verify_key().verify(LABEL, MESSAGE, bad)


@pytest.mark.parametrize("index", [0, 7, -1])
def test_a_flipped_byte_in_the_message_fails(
    key: SigningKey, signature: security_pb2.HybridSignature, index: int
) -> None:
    with pytest.raises(AuthenticationError) as caught:
        key.verify_key().verify(LABEL, flip(MESSAGE, index), signature)
    assert caught.value.reason == "tampered"


@pytest.mark.parametrize("other", [b"revocation-list", b"certificat", b"certificatex", b""])
def test_a_signature_for_one_label_is_invalid_under_another(
    key: SigningKey, signature: security_pb2.HybridSignature, other: bytes
) -> None:
    with pytest.raises(AuthenticationError):
        key.verify_key().verify(other, MESSAGE, signature)


def test_label_and_message_cannot_trade_bytes(key: SigningKey) -> None:
    """The label is length-prefixed: ("ab", "c...") and ("a", "bc...") sign different data."""
    signature = key.sign(b"ab", b"cd")
    with pytest.raises(AuthenticationError):
        key.verify_key().verify(b"a", b"bcd", signature)


def test_another_key_does_not_verify(signature: security_pb2.HybridSignature) -> None:
    with pytest.raises(AuthenticationError):
        SigningKey.generate().verify_key().verify(LABEL, MESSAGE, signature)


def test_one_half_of_another_key_is_not_enough(key: SigningKey) -> None:
    """Swapping in another key's ECDSA half fails, though the ML-DSA half is the real signer's."""
    mine, theirs = key.verify_key(), SigningKey.generate()
    mixed = security_pb2.HybridSignature(
        ecdsa_p256=theirs.sign(LABEL, MESSAGE).ecdsa_p256, mldsa65=key.sign(LABEL, MESSAGE).mldsa65
    )
    with pytest.raises(AuthenticationError):
        mine.verify(LABEL, MESSAGE, mixed)


def test_a_malformed_public_key_is_refused() -> None:
    with pytest.raises(AuthenticationError) as caught:
        VerifyKey(b"\x04" + b"\x00" * 64, b"\x00" * 10)
    assert caught.value.reason == "malformed"
