"""Hybrid signatures: ECDSA P-256 (SHA-256) and ML-DSA-65 (FIPS 204) over the same bytes.

A signature holds one of each and verifies only when both do, so forging one needs breaking both
the classical and the post-quantum scheme. Every signature is over a domain-separating context
label and the message, so a signature made for one purpose (a certificate, a handshake transcript,
a sealed request) is never valid for another.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, mldsa

from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import security_pb2

_MLDSA_CONTEXT = b"mohawk/v1"


def _labelled(label: bytes, message: bytes) -> bytes:
    return len(label).to_bytes(1, "big") + label + message


class VerifyKey:
    """The public half: verifies `HybridSignature`s."""

    def __init__(self, ecdsa_public: bytes, mldsa_public: bytes) -> None:
        try:
            self._ecdsa = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), ecdsa_public)
            self._mldsa = mldsa.MLDSA65PublicKey.from_public_bytes(mldsa_public)
        except ValueError as exc:
            raise AuthenticationError("malformed", "public signing key") from exc
        self.ecdsa_public, self.mldsa_public = ecdsa_public, mldsa_public

    def verify(self, label: bytes, message: bytes, signature: security_pb2.HybridSignature) -> None:
        """Return if both halves verify; raise AuthenticationError('tampered') otherwise."""
        data = _labelled(label, message)
        try:
            self._ecdsa.verify(signature.ecdsa_p256, data, ec.ECDSA(hashes.SHA256()))
            self._mldsa.verify(signature.mldsa65, data, _MLDSA_CONTEXT)
        except (InvalidSignature, ValueError) as exc:
            raise AuthenticationError("tampered", f"bad {label.decode()} signature") from exc


class SigningKey:
    """The private half: an ECDSA P-256 key and an ML-DSA-65 key, used together."""

    def __init__(self, ecdsa: ec.EllipticCurvePrivateKey, mldsa_seed: bytes) -> None:
        self._ecdsa = ecdsa
        self._mldsa = mldsa.MLDSA65PrivateKey.from_seed_bytes(mldsa_seed)
        self.mldsa_seed = mldsa_seed

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(ec.generate_private_key(ec.SECP256R1()), os.urandom(32))

    @classmethod
    def from_private_bytes(cls, ecdsa_pkcs8: bytes, mldsa_seed: bytes) -> SigningKey:
        key = serialization.load_der_private_key(ecdsa_pkcs8, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the ECDSA key is not an elliptic-curve key")
        return cls(key, mldsa_seed)

    @property
    def ecdsa_pkcs8(self) -> bytes:
        return self._ecdsa.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def verify_key(self) -> VerifyKey:
        point = self._ecdsa.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return VerifyKey(point, self._mldsa.public_key().public_bytes_raw())

    def sign(self, label: bytes, message: bytes) -> security_pb2.HybridSignature:
        data = _labelled(label, message)
        return security_pb2.HybridSignature(
            ecdsa_p256=self._ecdsa.sign(data, ec.ECDSA(hashes.SHA256())),
            mldsa65=self._mldsa.sign(data, _MLDSA_CONTEXT),
        )
