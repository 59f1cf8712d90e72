"""The PKI's records on the bus: a new revocation list, and rotated request-sealing keys.

Design. `revoke_and_publish` signs the next revocation list and puts it into the PKI bucket
(created if absent), where running services pick it up, then rotates the sealing key of every
model a revoked certificate held (`models_held_by`), leaving that certificate out;
`rotate_and_publish` rotates the keys of the models it is given. Each new sealing key goes into a
root-signed record, numbered past both the record on disk and the one on the bus, so a rerun after
a failure never publishes an older number. NATS and its bucket are reached before anything changes
on disk, so when they cannot be (ConnectionError) nothing changes at all; a refusal after the disk
has changed is a `PkiError` that says what to rerun.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect_or_give_up
from mohawk_common.bus.setup import BusLimits, ensure_buckets
from mohawk_common.logging import redact_url
from mohawk_pqc.errors import PkiError
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.pki_files import models_held_by, revoke, rotate_seal_key, seal_record_number
from mohawk_proto.v1 import security_pb2

CONNECT_DEADLINE_S = 4.0  # nats-py retries an unreachable server for a long time; give up after this


async def revoke_and_publish(
    pki: Path,
    serials: list[int],
    servers: list[str],
    limits: BusLimits,
    *,
    creds: Path | None = None,
    first: Callable[[], Awaitable[None]] | None = None,
) -> security_pb2.RevocationList:
    """Sign the next revocation list and put it into the PKI bucket (created if absent), then rotate
    the sealing key of every model a revoked certificate held (`models_held_by`), leaving it out.

    NATS and its bucket are reached first, so when they cannot be (ConnectionError) nothing
    changes on disk either; `first` (revoking the nodes' NATS users) runs once they are.
    """
    nc = await connect_or_give_up(servers, name="mohawk-pki", deadline_s=CONNECT_DEADLINE_S, creds=creds)
    try:
        bucket = await _pki_bucket(nc, servers, limits)
        if first is not None:
            await first()
        crl = revoke(pki, serials)
        try:
            await bucket.put(names.CRL_KEY, crl.SerializeToString(deterministic=True))
        except NatsError as exc:
            raise PkiError(
                f"{pki / 'crl'} is written but NATS refused it ({exc!r}); revoke again to publish"
            ) from exc
        await _rotate_seal_keys(bucket, pki, models_held_by(pki, serials))
        return crl
    finally:
        await nc.close()


async def rotate_and_publish(
    pki: Path,
    models: list[str],
    servers: list[str],
    limits: BusLimits,
    *,
    creds: Path | None = None,
    tls_ca: Path | None = None,
) -> list[security_pb2.SealKeyRecord]:
    """A new request-sealing key for each of `models`, its record put into the PKI bucket."""
    nc = await connect_or_give_up(
        servers, name="mohawk-pki", deadline_s=CONNECT_DEADLINE_S, creds=creds, tls_ca=tls_ca
    )
    try:
        return await _rotate_seal_keys(await _pki_bucket(nc, servers, limits), pki, models)
    finally:
        await nc.close()


async def _rotate_seal_keys(
    bucket: KeyValue, pki: Path, models: list[str]
) -> list[security_pb2.SealKeyRecord]:
    """Rotate each model's key on disk and publish its record, numbered past both the record on disk
    and the one on the bus."""
    records = []
    for model in models:
        key = names.seal_key_record_key(model)
        number = max(seal_record_number(pki, model), await _published_number(bucket, key)) + 1
        record = rotate_seal_key(pki, model, number=number, kem=CryptographyKem())
        try:
            await bucket.put(key, record.SerializeToString(deterministic=True))
        except NatsError as exc:
            raise PkiError(
                f"{model}'s new sealing key is written but NATS refused it ({exc!r}); "
                f"run `mohawk pki rotate-seal --model {model}` to publish one"
            ) from exc
        print(
            f"mohawk pki: sealing key of {model} rotated, published to {names.PKI_BUCKET}/{key}",
            file=sys.stderr,
        )
        records.append(record)
    return records


async def _published_number(bucket: KeyValue, key: str) -> int:
    try:
        entry = await bucket.get(key)
    except KeyNotFoundError:
        return 0
    record = security_pb2.SealKeyRecord.FromString(entry.value or b"")
    return security_pb2.SealKeyRecordBody.FromString(record.body).number


async def _pki_bucket(nc: NATS, servers: list[str], limits: BusLimits) -> KeyValue:
    try:
        return (await ensure_buckets(nc.jetstream(), limits)).pki
    except NatsError as exc:
        shown = redact_url(", ".join(servers))
        raise ConnectionError(f"NATS at {shown} has no usable JetStream: {exc!r}") from exc
