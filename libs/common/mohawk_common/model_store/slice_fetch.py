"""Slice packages through the JetStream object store: how a node gets weights without model files.

Each package lives in the `SLICES_BUCKET` object store as one object (the three files in the
container of `SlicePackage.to_bytes`) named by `slice_object_name(model, node_id)`. The store is
only transport: the package is signed and sealed, so `fetch_slice_source` trusts nothing it read
until `open_slice` has verified it for this node.
"""

from __future__ import annotations

import asyncio
import io
from typing import TYPE_CHECKING

from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError

from mohawk_common.bus.names import SLICES_BUCKET, slice_object_name
from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store.slice_source import SliceSource, open_slice_source

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext
    from nats.js.object_store import ObjectStore

    from mohawk_pqc.certificates import TrustStore
    from mohawk_pqc.identity import Identity
    from mohawk_pqc.slices import SlicePackage


async def push_slice(js: JetStreamContext, package: SlicePackage, *, replicas: int = 1) -> str:
    """Put `package` into the slices bucket (created if missing); return its object name.

    The name comes from the manifest's `served_model` and `recipient_node_id`; a package read
    unverified here is only routed, never trusted.
    """
    name = package_object_name(package)
    store = await _slices_store(js, create=True, replicas=replicas)
    await store.put(name, package.to_bytes())
    return name


def package_object_name(package: SlicePackage) -> str:
    """The object name of `package`: its manifest's `served_model` and `recipient_node_id`."""
    manifest = package.unverified_manifest()
    model, node_id = manifest.get("served_model"), manifest.get("recipient_node_id")
    try:
        return slice_object_name(str(model or ""), str(node_id or ""))
    except ValueError as exc:
        raise ModelLoadError(f"the slice package names no usable model and node: {exc}") from exc


async def fetch_slice(js: JetStreamContext, model: str, node_id: str) -> SlicePackage:
    """The (unverified) slice package of `model` for `node_id`; ModelLoadError when there is none."""
    from mohawk_pqc.slices import SlicePackage

    name = slice_object_name(model, node_id)
    store = await _slices_store(js, create=False)
    buffer = io.BytesIO()
    try:
        await store.get(name, writeinto=buffer)  # into a buffer: nats-py's default appends bytes
    except (ObjectNotFoundError, NotFoundError) as exc:
        raise ModelLoadError(f"no slice package {name!r} in object store {SLICES_BUCKET}") from exc
    return SlicePackage.from_bytes(buffer.getvalue())


async def fetch_slice_source(
    js: JetStreamContext,
    model: str,
    node_id: str,
    identity: Identity,
    trust: TrustStore,
    *,
    expect_model_revision: str | None = None,
) -> SliceSource:
    """Fetch this node's package of `model`, verify and decrypt it, and build its `ModelSource`.

    The package must be a slice of `model` (its manifest's `served_model`: the object's name is no
    proof) and, when `expect_model_revision` is given, of that revision. The verification and
    decryption run in a worker thread. Raises ModelLoadError (no package, or one that is not a
    usable slice) or AuthenticationError (any check of `open_slice` failed).
    """
    package = await fetch_slice(js, model, node_id)
    return await asyncio.to_thread(
        open_slice_source,
        package,
        identity,
        trust,
        expect_model=model,
        expect_model_revision=expect_model_revision,
    )


async def _slices_store(js: JetStreamContext, *, create: bool, replicas: int = 1) -> ObjectStore:
    try:
        return await js.object_store(SLICES_BUCKET)
    except (BucketNotFoundError, NotFoundError) as exc:
        if not create:
            raise ModelLoadError(f"object store {SLICES_BUCKET} does not exist (push a slice first)") from exc
    return await js.create_object_store(SLICES_BUCKET, replicas=replicas)
