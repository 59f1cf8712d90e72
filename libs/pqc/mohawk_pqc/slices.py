"""Slice packages: one node's share of a model's weights, signed by the operator, sealed to that node.

A package is three files:

    manifest.json         canonical JSON (sorted keys, no spaces): format version, model id and
                          revision, layer range, tensor list, size and SHA-256 of the plaintext
                          weights, policy tags, the recipient's node id and certificate serial, and
                          whatever opaque fields the packer adds
    manifest.sig          the root's hybrid signature over manifest.json (label "slice-manifest")
    weights.safetensors   a SealedEnvelope to the recipient's certified static KEM keys whose
                          plaintext is the safetensors file; its associated data is the SHA-256 of
                          manifest.json, so an envelope only opens together with its own manifest

`open_slice` checks, in this order, and returns nothing before every check has passed: the root's
signature over the manifest, the format version, and the model, model revision and layer range
the node asks for (each where it asks: an empty ask takes any), that the recipient is this node's
certified identity, the envelope (decryption under the manifest-bound associated data), and
the plaintext's size and SHA-256 against the manifest. This module handles opaque bytes and a
manifest dict only; what the weights mean is the model store's business.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from mohawk_pqc.certificates import Root, TrustStore, root_public
from mohawk_pqc.errors import AuthenticationError, PqcError
from mohawk_pqc.identity import Identity
from mohawk_pqc.kem import CryptographyKem, KemProvider
from mohawk_pqc.seal import open_sealed, seal
from mohawk_pqc.signing import SigningKey
from mohawk_proto.v1 import security_pb2

SLICE_FORMAT = 1
MANIFEST_LABEL = b"slice-manifest"
MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
WEIGHTS_FILE = "weights.safetensors"
RECIPIENT_ROLE = "shard"
_AAD_PREFIX = b"mohawk/v1 slice "
# One object on the bus: magic, then manifest, signature and sealed weights, each u64-length-prefixed.
_CONTAINER_MAGIC = b"MHSLICE1"
_LENGTH = struct.Struct("<Q")

# Fields the packer must supply, and their JSON types.
REQUIRED_FIELDS: dict[str, type | tuple[type, ...]] = {
    "model_id": str,
    "model_revision": str,
    "served_model": str,
    "layer_start": int,
    "layer_end": int,
    "embedding": bool,
    "head": bool,
    "tensors": list,
    "policy_tags": list,
}
# Fields `pack_slice` writes itself; a caller may not set them.
RESERVED_FIELDS = ("format_version", "size", "sha256", "recipient_node_id", "recipient_serial", "created")

Clock = Callable[[], float]


class SliceError(PqcError):
    """A slice package cannot be built, or its files are missing (operator-side, not an attack)."""


def canonical_json(data: Mapping[str, Any]) -> bytes:
    """The one byte form of a manifest: sorted keys, no spaces, ASCII, no NaN."""
    try:
        return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")
    except (TypeError, ValueError) as exc:
        raise SliceError(f"manifest fields are not plain JSON: {exc}") from exc


def weights_aad(manifest_bytes: bytes) -> bytes:
    """The sealed weights' associated data: binds the envelope to exactly this manifest."""
    return _AAD_PREFIX + hashlib.sha256(manifest_bytes).digest()


@dataclass(frozen=True)
class SlicePackage:
    """The three files of a slice package, as bytes."""

    manifest_bytes: bytes
    signature_bytes: bytes
    sealed_weights_bytes: bytes

    def unverified_manifest(self) -> dict[str, Any]:
        """The manifest, NOT verified: for routing and display only (`open_slice` verifies)."""
        return _parse_manifest(self.manifest_bytes)

    def write(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in self._files():
            tmp = directory / f"{name}.tmp"
            tmp.write_bytes(data)
            tmp.replace(directory / name)

    @classmethod
    def read(cls, directory: Path) -> SlicePackage:
        parts = []
        for name in (MANIFEST_FILE, SIGNATURE_FILE, WEIGHTS_FILE):
            try:
                parts.append((directory / name).read_bytes())
            except FileNotFoundError as exc:
                raise SliceError(f"{directory / name} is missing (not a slice package?)") from exc
            except OSError as exc:
                raise SliceError(f"cannot read {directory / name}: {exc.strerror or exc}") from exc
        return cls(*parts)

    def to_bytes(self) -> bytes:
        """One blob holding all three files (what goes into the object store)."""
        out = [_CONTAINER_MAGIC]
        for _name, data in self._files():
            out += [_LENGTH.pack(len(data)), data]
        return b"".join(out)

    @classmethod
    def from_bytes(cls, data: bytes) -> SlicePackage:
        if not data.startswith(_CONTAINER_MAGIC):
            raise AuthenticationError("malformed", "not a slice package blob")
        view, pos, parts = memoryview(data), len(_CONTAINER_MAGIC), []
        for _ in range(3):
            if pos + _LENGTH.size > len(data):
                raise AuthenticationError("malformed", "truncated slice package blob")
            (size,) = _LENGTH.unpack_from(data, pos)
            pos += _LENGTH.size
            if pos + size > len(data):
                raise AuthenticationError("malformed", "truncated slice package blob")
            parts.append(bytes(view[pos : pos + size]))
            pos += size
        if pos != len(data):
            raise AuthenticationError("malformed", "trailing bytes after the slice package")
        return cls(*parts)

    def _files(self) -> tuple[tuple[str, bytes], ...]:
        return (
            (MANIFEST_FILE, self.manifest_bytes),
            (SIGNATURE_FILE, self.signature_bytes),
            (WEIGHTS_FILE, self.sealed_weights_bytes),
        )


def pack_slice(
    root_key: SigningKey,
    recipient_cert: security_pb2.Certificate,
    manifest_fields: Mapping[str, Any],
    weights: bytes,
    *,
    kem: KemProvider | None = None,
    clock: Clock = time.time,
) -> SlicePackage:
    """Sign a manifest for `weights` and seal them to the node `recipient_cert` certifies.

    The certificate must be a valid shard certificate issued by this root: sealing to anything
    else would hand weights to a key the operator never vouched for.
    """
    _check_fields(manifest_fields)
    trust = TrustStore(Root(root_public(root_key)), clock=clock)
    try:
        body = trust.verify(recipient_cert, role=RECIPIENT_ROLE)
    except AuthenticationError as exc:
        raise SliceError(
            f"the recipient certificate is not a valid shard certificate ({exc.reason})"
        ) from exc
    manifest = {
        **manifest_fields,
        "format_version": SLICE_FORMAT,
        "size": len(weights),
        "sha256": hashlib.sha256(weights).hexdigest(),
        "recipient_node_id": body.node_id,
        "recipient_serial": body.serial,
        "created": clock(),
    }
    manifest_bytes = canonical_json(manifest)
    signature = root_key.sign(MANIFEST_LABEL, manifest_bytes)
    envelope = seal(body, weights, weights_aad(manifest_bytes), kem or CryptographyKem())
    return SlicePackage(
        manifest_bytes,
        signature.SerializeToString(deterministic=True),
        envelope.SerializeToString(deterministic=True),
    )


def open_slice(
    package: SlicePackage,
    identity: Identity,
    trust: TrustStore,
    *,
    expect_format: int = SLICE_FORMAT,
    expect_model: str | None = None,
    expect_model_revision: str | None = None,
    expect_layers: tuple[int, int] | None = None,
) -> tuple[dict[str, Any], bytes]:
    """Verify `package` for this node and return (manifest, plaintext weights); else AuthenticationError.

    `expect_model` is the served model name the node serves, `expect_model_revision` the revision it
    insists on, `expect_layers` a layer range the slice must hold; None (or "") accepts any.
    """
    # 1. The operator root signed exactly these manifest bytes.
    trust.root.verify_key.verify(MANIFEST_LABEL, package.manifest_bytes, _parse_signature(package))
    manifest = _parse_manifest(package.manifest_bytes)
    # 2. The format, model, revision and layers are the ones this node asks for.
    if manifest.get("format_version") != expect_format:
        raise AuthenticationError("bad_version", f"slice format {manifest.get('format_version')!r}")
    if expect_model and manifest.get("served_model") != expect_model:
        raise AuthenticationError(
            "bad_version", f"slice of model {manifest.get('served_model')!r}, not {expect_model!r}"
        )
    if expect_model_revision and manifest.get("model_revision") != expect_model_revision:
        raise AuthenticationError(
            "bad_version", f"model revision {manifest.get('model_revision')!r}, not {expect_model_revision!r}"
        )
    if expect_layers is not None:
        check_layers(manifest, *expect_layers)
    # 3. The package is for this node's certified identity, and so are the sealed weights.
    _check_recipient(manifest, identity, trust)
    envelope = _parse_envelope(package)
    if envelope.recipient_serial != identity.body.serial:
        raise AuthenticationError("untrusted", "slice weights are sealed to another certificate")
    # 4. Decrypt under associated data bound to this manifest; 5. the plaintext is what it names.
    weights = open_sealed(identity.kem_keys, envelope, weights_aad(package.manifest_bytes))
    if len(weights) != manifest.get("size") or hashlib.sha256(weights).hexdigest() != manifest.get("sha256"):
        raise AuthenticationError("bad_digest", "slice weights do not match the signed manifest")
    return manifest, weights


def check_layers(manifest: Mapping[str, Any], start: int, end: int) -> None:
    """AuthenticationError (bad_version) unless the manifest's layer range holds layers [start, end)."""
    held_start, held_end = manifest.get("layer_start"), manifest.get("layer_end")
    held = isinstance(held_start, int) and isinstance(held_end, int) and held_start <= start < end <= held_end
    if not held:
        raise AuthenticationError(
            "bad_version", f"layers [{start}, {end}) asked, the slice holds [{held_start}, {held_end})"
        )


def _check_fields(fields: Mapping[str, Any]) -> None:
    reserved = sorted(set(fields) & set(RESERVED_FIELDS))
    if reserved:
        raise SliceError(f"manifest fields {', '.join(reserved)} are set by pack_slice")
    for name, kind in REQUIRED_FIELDS.items():
        value = fields.get(name)
        # bool is an int in Python: a layer index must not be True/False.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SliceError(f"manifest field {name!r} is missing or not a {getattr(kind, '__name__', kind)}")
    if not 0 <= fields["layer_start"] < fields["layer_end"]:
        raise SliceError(f"bad layer range [{fields['layer_start']}, {fields['layer_end']})")
    if not all(isinstance(tag, str) for tag in fields["policy_tags"]):
        raise SliceError("policy_tags must be strings")


def _check_recipient(manifest: dict[str, Any], identity: Identity, trust: TrustStore) -> None:
    body = identity.body
    if manifest.get("recipient_node_id") != body.node_id or manifest.get("recipient_serial") != body.serial:
        raise AuthenticationError(
            "untrusted", f"slice is for {manifest.get('recipient_node_id')!r}, not {body.node_id!r}"
        )
    trust.verify(identity.certificate, node_id=body.node_id)  # still valid, not revoked


def _parse_manifest(data: bytes) -> dict[str, Any]:
    try:
        manifest = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise AuthenticationError("malformed", "slice manifest is not JSON") from exc
    if not isinstance(manifest, dict):
        raise AuthenticationError("malformed", "slice manifest is not a JSON object")
    return manifest


def _parse_signature(package: SlicePackage) -> security_pb2.HybridSignature:
    try:
        return security_pb2.HybridSignature.FromString(package.signature_bytes)
    except DecodeError as exc:
        raise AuthenticationError("tampered", "bad slice-manifest signature") from exc


def _parse_envelope(package: SlicePackage) -> security_pb2.SealedEnvelope:
    try:
        return security_pb2.SealedEnvelope.FromString(package.sealed_weights_bytes)
    except DecodeError as exc:
        raise AuthenticationError("malformed", "slice weights are not a sealed envelope") from exc
