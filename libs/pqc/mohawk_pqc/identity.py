"""A node's identity: its certificate and the private keys that go with it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import x25519

from mohawk_pqc.certificates import read_body
from mohawk_pqc.kem import CryptographyKem, KemDecapsulator
from mohawk_pqc.signing import SigningKey
from mohawk_proto.v1 import security_pb2


@dataclass(frozen=True)
class KemKeyPair:
    """Static X25519 + ML-KEM-768 keys: what sealed envelopes to this holder are opened with."""

    x25519: x25519.X25519PrivateKey
    mlkem: KemDecapsulator
    x25519_raw: bytes
    mlkem_seed: bytes

    @classmethod
    def generate(cls) -> KemKeyPair:
        return cls.from_private_bytes(os.urandom(32), os.urandom(64))

    @classmethod
    def from_private_bytes(cls, x25519_raw: bytes, mlkem_seed: bytes) -> KemKeyPair:
        return cls(
            x25519.X25519PrivateKey.from_private_bytes(x25519_raw),
            CryptographyKem().from_seed(mlkem_seed),
            x25519_raw,
            mlkem_seed,
        )

    @property
    def x25519_public(self) -> bytes:
        return self.x25519.public_key().public_bytes_raw()

    @property
    def mlkem_public(self) -> bytes:
        return self.mlkem.public_bytes


@dataclass(frozen=True)
class Identity:
    """A certified node: certificate, signing key, static KEM keys."""

    certificate: security_pb2.Certificate
    signing_key: SigningKey
    kem_keys: KemKeyPair

    @property
    def body(self) -> security_pb2.CertificateBody:
        return read_body(self.certificate)

    @property
    def node_id(self) -> str:
        return self.body.node_id

    def private_bundle(self) -> security_pb2.PrivateKeyBundle:
        return security_pb2.PrivateKeyBundle(
            ecdsa_p256_private=self.signing_key.ecdsa_pkcs8,
            mldsa65_seed=self.signing_key.mldsa_seed,
            x25519_private=self.kem_keys.x25519_raw,
            mlkem768_seed=self.kem_keys.mlkem_seed,
        )

    @classmethod
    def from_files(cls, cert: security_pb2.Certificate, bundle: security_pb2.PrivateKeyBundle) -> Identity:
        return cls(
            cert,
            SigningKey.from_private_bytes(bundle.ecdsa_p256_private, bundle.mldsa65_seed),
            KemKeyPair.from_private_bytes(bundle.x25519_private, bundle.mlkem768_seed),
        )


def certificate_body_for(
    node_id: str,
    role: str,
    signing: SigningKey,
    kem: KemKeyPair,
    *,
    serial: int,
    not_before: float,
    not_after: float,
    model: str = "",
) -> security_pb2.CertificateBody:
    verify = signing.verify_key()
    return security_pb2.CertificateBody(
        serial=serial,
        node_id=node_id,
        role=role,
        ecdsa_p256_public=verify.ecdsa_public,
        mldsa65_public=verify.mldsa_public,
        x25519_public=kem.x25519_public,
        mlkem768_public=kem.mlkem_public,
        not_before=not_before,
        not_after=not_after,
        model=model,
    )
