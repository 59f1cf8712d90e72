"""ML-KEM-768 providers: OpenSSL's through `cryptography`, and liboqs's where it is installed.

`oqs` is imported only after `find_liboqs()` has found the library: importing liboqs-python
without it waits, tries to download and build liboqs, and raises.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mohawk_pqc.errors import PkiError
from mohawk_pqc.kem import (
    MLKEM768_CIPHERTEXT_BYTES,
    MLKEM768_PUBLIC_BYTES,
    CryptographyKem,
    KemProvider,
    OqsKem,
    find_liboqs,
    load_kem_provider,
    oqs_available,
)
from tests.real_parts import missing

NO_LIBOQS = "no OQS_INSTALL_PATH, no liboqs on the library path"


@pytest.fixture
def liboqs() -> None:
    """liboqs, or the test fails saying how to get it (skips only as MOHAWK_SKIP_MISSING asks)."""
    if not oqs_available():
        missing("liboqs", NO_LIBOQS if find_liboqs() is None else "found, but liboqs-python is not installed")


def round_trip(sender: KemProvider, holder: KemProvider) -> None:
    """`sender` encapsulates to a key `holder` generated; both must hold the same secret."""
    key = holder.generate()
    assert len(key.public_bytes) == MLKEM768_PUBLIC_BYTES
    shared, ciphertext = sender.encapsulate(key.public_bytes)
    assert len(ciphertext) == MLKEM768_CIPHERTEXT_BYTES and len(shared) == 32
    assert key.decapsulate(ciphertext) == shared


def test_cryptography_round_trip() -> None:
    round_trip(CryptographyKem(), CryptographyKem())


def test_cryptography_keys_from_one_seed_are_one_key() -> None:
    seed = bytes(range(64))
    first, second = CryptographyKem().from_seed(seed), CryptographyKem().from_seed(seed)
    assert first.public_bytes == second.public_bytes
    shared, ciphertext = CryptographyKem().encapsulate(first.public_bytes)
    assert second.decapsulate(ciphertext) == shared
    assert CryptographyKem().from_seed(bytes(64)).decapsulate(ciphertext) != shared  # implicit rejection


def test_auto_is_liboqs_where_installed_else_cryptography() -> None:
    expected = "oqs" if oqs_available() else "cryptography"
    assert load_kem_provider("auto").name == expected
    assert load_kem_provider().name == "cryptography"


def test_an_unknown_provider_is_a_pki_error() -> None:
    with pytest.raises(PkiError, match="nope"):
        load_kem_provider("nope")


def test_oqs_without_liboqs_is_a_pki_error_not_a_download(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OQS_INSTALL_PATH", raising=False)
    monkeypatch.setattr("mohawk_pqc.kem.ctypes.util.find_library", lambda name: None)
    with pytest.raises(PkiError, match="liboqs is not installed"):
        OqsKem()
    assert load_kem_provider("auto").name == "cryptography"


def test_liboqs_without_its_binding_is_a_pki_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("mohawk_pqc.kem.find_liboqs", lambda: "/usr/lib/liboqs.so")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        "mohawk_pqc.kem.importlib.util.find_spec",
        lambda name, *args: None if name == "oqs" else real_find_spec(name, *args),
    )
    with pytest.raises(PkiError, match="liboqs-python"):
        OqsKem()
    assert load_kem_provider("auto").name == "cryptography"


def test_find_liboqs_honours_oqs_install_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "liboqs.so").write_bytes(b"")
    monkeypatch.setenv("OQS_INSTALL_PATH", str(tmp_path))
    assert find_liboqs() == str(tmp_path / "lib" / "liboqs.so")


@pytest.mark.usefixtures("liboqs")
def test_oqs_round_trip() -> None:
    round_trip(OqsKem(), OqsKem())


@pytest.mark.usefixtures("liboqs")
def test_oqs_and_cryptography_interoperate_both_ways() -> None:
    round_trip(OqsKem(), CryptographyKem())  # liboqs encapsulates to an OpenSSL key
    round_trip(CryptographyKem(), OqsKem())  # and OpenSSL to a liboqs key


@pytest.mark.usefixtures("liboqs")
def test_oqs_decapsulates_what_cryptography_sealed_to_a_seeded_key() -> None:
    """A static key (from its seed, as node keys are) opened by OpenSSL after liboqs encapsulated."""
    key = CryptographyKem().from_seed(bytes(range(64)))
    shared, ciphertext = OqsKem().encapsulate(key.public_bytes)
    assert key.decapsulate(ciphertext) == shared
