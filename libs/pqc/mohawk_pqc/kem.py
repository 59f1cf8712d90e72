"""Hybrid key encapsulation: ephemeral X25519 plus ML-KEM-768 (FIPS 203), from one of two providers.

ML-KEM comes from the `cryptography` package (OpenSSL) by default, or from liboqs-python when the
liboqs shared library is installed. liboqs is looked for the way liboqs-python itself does
(`OQS_INSTALL_PATH`, else the system library path) *before* `oqs` is imported, because importing
it without the library tries to download and build liboqs. Both providers speak raw FIPS 203
encapsulation keys and ciphertexts, so either side of a channel may use either.
"""

from __future__ import annotations

import ctypes.util
import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric import mlkem

from mohawk_pqc.errors import PkiError

MLKEM768_PUBLIC_BYTES = 1184
MLKEM768_CIPHERTEXT_BYTES = 1088


class KemDecapsulator(Protocol):
    """An ML-KEM-768 private key."""

    @property
    def public_bytes(self) -> bytes: ...

    def decapsulate(self, ciphertext: bytes) -> bytes: ...


class KemProvider(Protocol):
    name: str

    def generate(self) -> KemDecapsulator: ...

    def encapsulate(self, public_bytes: bytes) -> tuple[bytes, bytes]:
        """(shared secret, ciphertext) for the holder of `public_bytes`."""
        ...


class _CryptographyKey:
    def __init__(self, key: mlkem.MLKEM768PrivateKey) -> None:
        self._key = key
        self.public_bytes = key.public_key().public_bytes_raw()

    def decapsulate(self, ciphertext: bytes) -> bytes:
        return self._key.decapsulate(ciphertext)


class CryptographyKem:
    """ML-KEM-768 from OpenSSL through `cryptography` (the default)."""

    name = "cryptography"

    def generate(self) -> KemDecapsulator:
        return _CryptographyKey(mlkem.MLKEM768PrivateKey.generate())

    def from_seed(self, seed: bytes) -> KemDecapsulator:
        """A deterministic key from its 64-byte FIPS 203 seed (static keys, known-answer tests)."""
        return _CryptographyKey(mlkem.MLKEM768PrivateKey.from_seed_bytes(seed))

    def encapsulate(self, public_bytes: bytes) -> tuple[bytes, bytes]:
        shared, ciphertext = mlkem.MLKEM768PublicKey.from_public_bytes(public_bytes).encapsulate()
        return shared, ciphertext


class _OqsKey:
    def __init__(self, oqs: Any) -> None:
        self._kem = oqs.KeyEncapsulation("ML-KEM-768")
        self.public_bytes = bytes(self._kem.generate_keypair())

    def decapsulate(self, ciphertext: bytes) -> bytes:
        return bytes(self._kem.decap_secret(ciphertext))


class OqsKem:
    """ML-KEM-768 from liboqs through liboqs-python."""

    name = "oqs"

    def __init__(self) -> None:
        if find_liboqs() is None:
            raise PkiError("liboqs is not installed (no OQS_INSTALL_PATH, no liboqs on the library path)")
        if importlib.util.find_spec("oqs") is None:  # locates the package without running it
            raise PkiError("liboqs-python is not installed (pip install liboqs-python)")
        self._oqs = importlib.import_module("oqs")

    def generate(self) -> KemDecapsulator:
        return _OqsKey(self._oqs)

    def encapsulate(self, public_bytes: bytes) -> tuple[bytes, bytes]:
        with self._oqs.KeyEncapsulation("ML-KEM-768") as kem:
            ciphertext, shared = kem.encap_secret(public_bytes)
        return bytes(shared), bytes(ciphertext)


def find_liboqs() -> str | None:
    """The liboqs shared library, found as liboqs-python finds it, or None; never imports `oqs`."""
    install = os.environ.get("OQS_INSTALL_PATH")
    if install:
        for sub in ("lib", "lib64"):
            for name in ("liboqs.so", "liboqs.dylib"):
                candidate = Path(install) / sub / name
                if candidate.exists():
                    return str(candidate)
    return ctypes.util.find_library("oqs")


def oqs_available() -> bool:
    """Both liboqs and its Python binding are installed (checked without importing `oqs`)."""
    return find_liboqs() is not None and importlib.util.find_spec("oqs") is not None


def load_kem_provider(name: str = "cryptography") -> KemProvider:
    """`cryptography`, `oqs`, or `auto` (liboqs when it is installed, else cryptography)."""
    if name == "cryptography":
        return CryptographyKem()
    if name == "oqs":
        return OqsKem()
    if name == "auto":
        return OqsKem() if oqs_available() else CryptographyKem()
    raise PkiError(f"unknown KEM provider {name!r} (cryptography, oqs or auto)")
