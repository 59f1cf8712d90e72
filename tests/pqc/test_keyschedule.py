"""Known-answer tests: every derivation recomputed here from RFC 5869 with the standard library.

The HKDF below is written from the RFC (extract, then expand) with `hmac`/`hashlib` only, and is
itself checked against RFC 5869's test cases, so a mistake in libs/pqc's labels, salts, input
order or output split shows up as a mismatch rather than being shared by both sides.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest
from cryptography.hazmat.primitives.asymmetric import x25519

from mohawk_pqc import keyschedule
from mohawk_pqc.handshake import HandshakeInitiator, HandshakeResponder
from mohawk_pqc.kem import CryptographyKem
from mohawk_proto.v1 import security_pb2
from tests.pqc.helpers import NOW, ScratchPki, expect_peer


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869, section 2: PRK = HMAC(salt, IKM); T(i) = HMAC(PRK, T(i-1) | info | i)."""
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
    return okm[:length]


def transcript(*parts: bytes) -> bytes:
    return hashlib.sha256(
        b"mohawk/v1 handshake" + b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    ).digest()


SS_X25519 = bytes(range(32))
SS_MLKEM = bytes(range(100, 132))
TRANSCRIPT = hashlib.sha256(b"a transcript").digest()
CHANNEL_ID = bytes.fromhex("00112233445566778899aabbccddeeff")

# RFC 7748, section 6.1: Alice's and Bob's X25519 keys and their shared secret
ALICE_PRIVATE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ALICE_PUBLIC = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
BOB_PRIVATE = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
BOB_PUBLIC = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
X25519_SHARED = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
MLKEM_SEED = bytes(range(64))  # d || z of the initiator's ephemeral ML-KEM-768 key


@pytest.mark.parametrize(
    ("ikm", "salt", "info", "length", "okm"),
    [
        (  # RFC 5869, A.1
            bytes([0x0B] * 22),
            bytes(range(13)),
            bytes(range(0xF0, 0xFA)),
            42,
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865",
        ),
        (  # RFC 5869, A.3: empty salt and info (next_key uses an empty salt)
            bytes([0x0B] * 22),
            b"",
            b"",
            42,
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8",
        ),
    ],
    ids=["rfc5869-a1", "rfc5869-a3"],
)
def test_the_reference_hkdf_matches_rfc_5869(
    ikm: bytes, salt: bytes, info: bytes, length: int, okm: str
) -> None:
    assert hkdf_sha256(ikm, salt, info, length).hex() == okm


def test_transcript_hash() -> None:
    assert keyschedule.transcript_hash(b"first", b"second") == transcript(b"first", b"second")
    assert keyschedule.transcript_hash() == hashlib.sha256(b"mohawk/v1 handshake").digest()
    assert keyschedule.transcript_hash(b"ab", b"c") != keyschedule.transcript_hash(b"a", b"bc")


def test_channel_keys() -> None:
    okm = hkdf_sha256(SS_X25519 + SS_MLKEM, TRANSCRIPT, b"mohawk/v1 channel" + CHANNEL_ID, 64)
    assert keyschedule.channel_keys(SS_X25519, SS_MLKEM, TRANSCRIPT, CHANNEL_ID) == (okm[:32], okm[32:])


@pytest.mark.parametrize("which", ["x25519", "mlkem", "transcript", "channel"])
def test_channel_keys_depend_on_every_input(which: str) -> None:
    inputs = {"x25519": SS_X25519, "mlkem": SS_MLKEM, "transcript": TRANSCRIPT, "channel": CHANNEL_ID}
    changed = dict(inputs, **{which: bytes(len(inputs[which]))})
    base = keyschedule.channel_keys(*inputs.values())
    other = keyschedule.channel_keys(*changed.values())
    assert set(base).isdisjoint(other)


def test_next_key_is_a_chain() -> None:
    key = bytes(range(32))
    expected = hkdf_sha256(key, b"", b"mohawk/v1 rotate", 32)
    assert keyschedule.next_key(key) == expected
    assert keyschedule.next_key(expected) == hkdf_sha256(expected, b"", b"mohawk/v1 rotate", 32)


def test_seal_key() -> None:
    parts = (b"ephemeral x25519", b"mlkem ciphertext", b"", b"recipient mlkem key")
    salt = hashlib.sha256(b"".join(len(p).to_bytes(4, "big") + p for p in parts)).digest()
    assert keyschedule.seal_key(SS_X25519, SS_MLKEM, *parts) == hkdf_sha256(
        SS_X25519 + SS_MLKEM, salt, b"mohawk/v1 seal", 32
    )
    assert keyschedule.seal_key(SS_X25519, SS_MLKEM, b"ab", b"c") != keyschedule.seal_key(
        SS_X25519, SS_MLKEM, b"a", b"bc"
    )


def test_a_handshake_with_injected_randomness_derives_the_known_keys(pki: ScratchPki) -> None:
    """Both ephemeral X25519 keys, the initiator's ML-KEM key, the channel id and the clock are fixed.

    The responder's ML-KEM encapsulation randomness cannot be injected through `cryptography`
    (OpenSSL draws it internally), so the ML-KEM shared secret is not a fixed constant: it is
    recovered here by decapsulating the responder's ciphertext with the initiator's ephemeral key
    rebuilt from its seed, and everything downstream of it is recomputed independently.
    """
    a, b = pki.identity("shard-a"), pki.identity("shard-b")

    def initiator() -> HandshakeInitiator:
        return HandshakeInitiator(
            a,
            pki.trust(),
            plan_version=3,
            responder_id="shard-b",
            accept_peer=expect_peer("shard-b", "shard"),
            kem=CryptographyKem(),
            channel_id=CHANNEL_ID,
            ephemeral_x25519=x25519.X25519PrivateKey.from_private_bytes(ALICE_PRIVATE),
            ephemeral_kem=CryptographyKem().from_seed(MLKEM_SEED),
            clock=pki.clock,
        )

    ini = initiator()
    responder = HandshakeResponder(
        b,
        pki.trust(),
        accept_peer=expect_peer("shard-a", "shard"),
        kem=CryptographyKem(),
        ephemeral_x25519=x25519.X25519PrivateKey.from_private_bytes(BOB_PRIVATE),
        clock=pki.clock,
    )
    offer_bytes = ini.init_message()

    def unsigned(init_bytes: bytes) -> security_pb2.HandshakeInit:
        init = security_pb2.HandshakeInit.FromString(init_bytes)
        init.ClearField("signature")  # ECDSA's and ML-DSA's own randomness: not ours to fix
        return init

    assert unsigned(initiator().init_message()) == unsigned(offer_bytes)  # nothing of ours is random
    offer = security_pb2.HandshakeInit.FromString(offer_bytes)
    assert (offer.x25519_public, offer.channel_id, offer.sent_at) == (ALICE_PUBLIC, CHANNEL_ID, NOW)
    assert offer.mlkem768_public == CryptographyKem().from_seed(MLKEM_SEED).public_bytes

    response_bytes = responder.respond(offer_bytes)
    finish, initiator_keys = ini.handle_response(response_bytes)
    responder_keys = responder.finish(finish)

    response = security_pb2.HandshakeResponse.FromString(response_bytes)
    assert response.x25519_public == BOB_PUBLIC
    ss_mlkem = CryptographyKem().from_seed(MLKEM_SEED).decapsulate(response.mlkem768_ciphertext)
    response.ClearField("signature")
    t1 = transcript(offer_bytes, response.SerializeToString(deterministic=True))
    okm = hkdf_sha256(X25519_SHARED + ss_mlkem, t1, b"mohawk/v1 channel" + CHANNEL_ID, 64)

    assert initiator_keys.channel_id == responder_keys.channel_id == CHANNEL_ID
    assert (initiator_keys.send_key, initiator_keys.receive_key) == (okm[:32], okm[32:])
    assert (responder_keys.send_key, responder_keys.receive_key) == (okm[32:], okm[:32])
    assert keyschedule.channel_keys(X25519_SHARED, ss_mlkem, t1, CHANNEL_ID) == (okm[:32], okm[32:])
