"""Every key derivation of Mohawk's channels, in one place, with its labels (known-answer tested).

    channel keys = HKDF-SHA256(ikm = ss_x25519 || ss_mlkem, salt = transcript hash,
                               info = "mohawk/v1 channel" || channel id)  -> 64 bytes
                   first 32: initiator -> responder, last 32: responder -> initiator
    next key     = HKDF-SHA256(ikm = key, salt = "", info = "mohawk/v1 rotate") -> 32 bytes
    seal key     = HKDF-SHA256(ikm = ss_x25519 || ss_mlkem, salt = SHA-256(ephemeral keys ||
                               recipient keys), info = "mohawk/v1 seal") -> 32 bytes

Concatenating both shared secrets under one KDF keeps the keys secret as long as either X25519 or
ML-KEM-768 holds (the usual hybrid construction, as in TLS's X25519MLKEM768).
"""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
SUITE = "x25519-mlkem768/aes-256-gcm/hkdf-sha256"
_CHANNEL_INFO = b"mohawk/v1 channel"
_ROTATE_INFO = b"mohawk/v1 rotate"
_SEAL_INFO = b"mohawk/v1 seal"
_TRANSCRIPT_LABEL = b"mohawk/v1 handshake"


def _hkdf(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def transcript_hash(*parts: bytes) -> bytes:
    """SHA-256 over the handshake messages, each length-prefixed so no two transcripts collide."""
    digest = hashlib.sha256(_TRANSCRIPT_LABEL)
    for part in parts:
        digest.update(len(part).to_bytes(4, "big"))
        digest.update(part)
    return digest.digest()


def channel_keys(
    ss_x25519: bytes, ss_mlkem: bytes, transcript: bytes, channel_id: bytes
) -> tuple[bytes, bytes]:
    """(initiator -> responder key, responder -> initiator key)."""
    okm = _hkdf(ss_x25519 + ss_mlkem, transcript, _CHANNEL_INFO + channel_id, 2 * KEY_BYTES)
    return okm[:KEY_BYTES], okm[KEY_BYTES:]


def next_key(key: bytes) -> bytes:
    """The key of the next epoch (forward only: an old key does not follow from a new one)."""
    return _hkdf(key, b"", _ROTATE_INFO, KEY_BYTES)


def seal_key(ss_x25519: bytes, ss_mlkem: bytes, *public_parts: bytes) -> bytes:
    salt = hashlib.sha256(b"".join(len(p).to_bytes(4, "big") + p for p in public_parts)).digest()
    return _hkdf(ss_x25519 + ss_mlkem, salt, _SEAL_INFO, KEY_BYTES)
