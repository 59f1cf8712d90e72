"""Slice packages: signed by the root, sealed to one node, verified in order before anything loads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save

from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.identity import Identity
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.seal import open_sealed, seal
from mohawk_pqc.slices import (
    MANIFEST_LABEL,
    SliceError,
    SlicePackage,
    canonical_json,
    open_slice,
    pack_slice,
    weights_aad,
)
from mohawk_proto.v1 import security_pb2
from tests.pqc.helpers import Clock, ScratchPki, flip


def fields(**changes: Any) -> dict[str, Any]:
    base = {
        "model_id": "tiny",
        "model_revision": "r1",
        "served_model": "tiny-chat",
        "layer_start": 2,
        "layer_end": 4,
        "embedding": False,
        "head": False,
        "tensors": [{"name": "a", "shape": [4, 8], "dtype": "F32"}],
        "policy_tags": ["eu-only"],
        "extra": {"opaque": [1, 2, 3]},
    }
    return base | changes


def weights(seed: int = 0) -> bytes:
    return save({"a": np.random.default_rng(seed).standard_normal((4, 8), dtype=np.float32)})


@pytest.fixture
def node_a(pki: ScratchPki) -> Identity:
    return pki.identity("node-a")


@pytest.fixture
def node_b(pki: ScratchPki) -> Identity:
    return pki.identity("node-b")


def pack(
    pki: ScratchPki, clock: Clock, to: Identity, data: bytes | None = None, **changes: Any
) -> SlicePackage:
    return pack_slice(pki.root_key, to.certificate, fields(**changes), data or weights(), clock=clock)


def resigned(pki: ScratchPki, package: SlicePackage, **changes: Any) -> SlicePackage:
    """`package` with manifest fields changed and validly re-signed by the root (envelope untouched)."""
    manifest = json.loads(package.manifest_bytes) | changes
    data = canonical_json(manifest)
    signature = pki.root_key.sign(MANIFEST_LABEL, data).SerializeToString()
    return SlicePackage(data, signature, package.sealed_weights_bytes)


def rejected(package: SlicePackage, identity: Identity, pki: ScratchPki, **kwargs: Any) -> str:
    with pytest.raises(AuthenticationError) as info:
        open_slice(package, identity, pki.trust(), **kwargs)
    return info.value.reason


def test_recipient_opens_exact_weights_and_signed_manifest(
    pki: ScratchPki, clock: Clock, node_a: Identity
) -> None:
    data = weights()
    package = pack(pki, clock, node_a, data)
    manifest, plaintext = open_slice(package, node_a, pki.trust(), expect_model_revision="r1")
    assert plaintext == data
    assert manifest == fields() | {
        "format_version": 1,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "recipient_node_id": "node-a",
        "recipient_serial": node_a.body.serial,
        "created": clock.now,
    }
    assert package.manifest_bytes == json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    assert data not in package.sealed_weights_bytes


def test_another_node_cannot_open(pki: ScratchPki, clock: Clock, node_a: Identity, node_b: Identity) -> None:
    package = pack(pki, clock, node_a)
    assert rejected(package, node_b, pki) == "untrusted"
    # Even skipping the recipient check, B's keys do not open what was sealed to A.
    envelope = security_pb2.SealedEnvelope.FromString(package.sealed_weights_bytes)
    with pytest.raises(AuthenticationError) as info:
        open_sealed(node_b.kem_keys, envelope, weights_aad(package.manifest_bytes))
    assert info.value.reason == "tampered"


def test_tampered_manifest_byte_is_a_bad_signature(pki: ScratchPki, clock: Clock, node_a: Identity) -> None:
    package = pack(pki, clock, node_a)
    edited = package.manifest_bytes.replace(b'"layer_start":2', b'"layer_start":0')
    assert edited != package.manifest_bytes
    for manifest in (edited, flip(package.manifest_bytes, 10)):
        forged = SlicePackage(manifest, package.signature_bytes, package.sealed_weights_bytes)
        assert rejected(forged, node_a, pki) == "tampered"
    garbled = SlicePackage(package.manifest_bytes, b"\xff" * 9, package.sealed_weights_bytes)
    assert rejected(garbled, node_a, pki) == "tampered"


def test_manifest_signed_by_another_root_is_rejected(
    pki: ScratchPki, other_pki: ScratchPki, clock: Clock, node_a: Identity
) -> None:
    package = pack(pki, clock, node_a)
    foreign = other_pki.root_key.sign(MANIFEST_LABEL, package.manifest_bytes).SerializeToString()
    assert rejected(
        SlicePackage(package.manifest_bytes, foreign, package.sealed_weights_bytes), node_a, pki
    ) == ("tampered")


def test_flipped_byte_in_sealed_weights_is_rejected(pki: ScratchPki, clock: Clock, node_a: Identity) -> None:
    package = pack(pki, clock, node_a)
    for index in (-1, -40):  # the GCM tag, then ciphertext
        flipped = SlicePackage(
            package.manifest_bytes, package.signature_bytes, flip(package.sealed_weights_bytes, index)
        )
        assert rejected(flipped, node_a, pki) == "tampered"


def test_weights_swapped_from_another_package_are_rejected(
    pki: ScratchPki, clock: Clock, node_a: Identity
) -> None:
    first, second = pack(pki, clock, node_a, weights(1)), pack(pki, clock, node_a, weights(2))
    swapped = SlicePackage(first.manifest_bytes, first.signature_bytes, second.sealed_weights_bytes)
    assert rejected(swapped, node_a, pki) == "tampered"  # the envelope's AAD names its own manifest


def test_weights_not_matching_a_signed_digest_are_bad_digest(
    pki: ScratchPki, clock: Clock, node_a: Identity
) -> None:
    # A root-signed manifest whose digest lies, with weights sealed under that manifest: only the
    # final digest check stands between these weights and the engine.
    good = pack(pki, clock, node_a)
    lying = resigned(pki, good, sha256=hashlib.sha256(b"other").hexdigest())
    envelope = seal(node_a.body, weights(), weights_aad(lying.manifest_bytes), CryptographyKem())
    package = SlicePackage(lying.manifest_bytes, lying.signature_bytes, envelope.SerializeToString())
    assert rejected(package, node_a, pki) == "bad_digest"
    short = resigned(pki, good, size=1)
    envelope = seal(node_a.body, weights(), weights_aad(short.manifest_bytes), CryptographyKem())
    package = SlicePackage(short.manifest_bytes, short.signature_bytes, envelope.SerializeToString())
    assert rejected(package, node_a, pki) == "bad_digest"


def test_other_format_or_revision_is_bad_version(pki: ScratchPki, clock: Clock, node_a: Identity) -> None:
    package = pack(pki, clock, node_a)
    assert rejected(resigned(pki, package, format_version=2), node_a, pki) == "bad_version"
    assert rejected(package, node_a, pki, expect_model_revision="r2") == "bad_version"
    assert rejected(package, node_a, pki, expect_format=2) == "bad_version"


def test_other_model_or_layer_range_is_bad_version(pki: ScratchPki, clock: Clock, node_a: Identity) -> None:
    package = pack(pki, clock, node_a)  # tiny-chat, layers [2, 4)
    assert rejected(package, node_a, pki, expect_model="other-chat") == "bad_version"
    for layers in ((0, 4), (2, 5), (1, 3), (4, 6)):
        assert rejected(package, node_a, pki, expect_layers=layers) == "bad_version", layers
    for layers in ((2, 4), (2, 3), (3, 4)):
        open_slice(package, node_a, pki.trust(), expect_model="tiny-chat", expect_layers=layers)
    open_slice(package, node_a, pki.trust(), expect_model="", expect_model_revision="")  # empty: any


def test_checks_run_in_order(pki: ScratchPki, clock: Clock, node_a: Identity, node_b: Identity) -> None:
    package = pack(pki, clock, node_a)
    bad_everything = SlicePackage(flip(package.manifest_bytes, 5), package.signature_bytes, b"junk")
    assert rejected(bad_everything, node_b, pki, expect_model_revision="r2") == "tampered"
    assert rejected(package, node_b, pki, expect_model_revision="r2") == "bad_version"
    assert rejected(SlicePackage(package.manifest_bytes, package.signature_bytes, b"junk"), node_b, pki) == (
        "untrusted"
    )


def test_recipient_with_revoked_certificate_cannot_open(
    pki: ScratchPki, clock: Clock, node_a: Identity
) -> None:
    package = pack(pki, clock, node_a)
    trust = pki.trust()
    trust.update_revocations(pki.crl(2, [node_a.body.serial]))
    with pytest.raises(AuthenticationError) as info:
        open_slice(package, node_a, trust)
    assert info.value.reason == "revoked"


def test_same_node_id_with_another_certificate_cannot_open(
    pki: ScratchPki, clock: Clock, node_a: Identity
) -> None:
    package = pack(pki, clock, node_a)
    reissued = pki.identity("node-a")
    assert rejected(package, reissued, pki) == "untrusted"


def test_pack_refuses_bad_recipients_and_fields(
    pki: ScratchPki, other_pki: ScratchPki, clock: Clock, node_a: Identity
) -> None:
    with pytest.raises(SliceError, match="not a valid shard certificate"):
        pack(pki, clock, other_pki.identity("node-a"))
    with pytest.raises(SliceError, match="not a valid shard certificate"):
        pack(pki, clock, pki.identity("gw", "gateway"))
    with pytest.raises(SliceError, match="set by pack_slice"):
        pack(pki, clock, node_a, sha256="00")
    with pytest.raises(SliceError, match="layer_end"):
        pack(pki, clock, node_a, layer_end="4")
    with pytest.raises(SliceError, match="layer range"):
        pack(pki, clock, node_a, layer_start=4, layer_end=4)
    with pytest.raises(SliceError, match="plain JSON"):
        pack(pki, clock, node_a, extra=b"bytes")


def test_directory_and_blob_round_trips(
    tmp_path: Path, pki: ScratchPki, clock: Clock, node_a: Identity
) -> None:
    package = pack(pki, clock, node_a)
    package.write(tmp_path / "pkg")
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == [
        "manifest.json",
        "manifest.sig",
        "weights.safetensors",
    ]
    assert SlicePackage.read(tmp_path / "pkg") == package
    assert SlicePackage.from_bytes(package.to_bytes()) == package
    assert package.unverified_manifest()["recipient_node_id"] == "node-a"
    with pytest.raises(SliceError, match="missing"):
        SlicePackage.read(tmp_path / "nothing")
    blob = package.to_bytes()
    for bad in (b"", blob[:-1], blob + b"x", b"NOTSLICE" + blob[8:]):
        with pytest.raises(AuthenticationError) as info:
            SlicePackage.from_bytes(bad)
        assert info.value.reason == "malformed"
