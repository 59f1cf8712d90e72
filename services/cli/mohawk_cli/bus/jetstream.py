"""`mohawk bus streams | consumers | kv`: JetStream's streams, consumers and key-value buckets, read-only.

The tables carry what `nats stream ls`, `nats consumer ls` and `nats kv ls` show an operator
deciding whether the bus is healthy: message and byte counts, how far each consumer is behind
(`pending`: stored but not delivered yet; `ack pending`: delivered, not acknowledged;
`redelivered`), and each bucket's size and TTL. Key-value buckets are the streams named `KV_<bucket>`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.js.api import StreamInfo
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from mohawk_cli.bus import BusInspectError, format_table
from mohawk_common.bus.connect import connect_or_give_up

KV_PREFIX = "KV_"


@asynccontextmanager
async def connected(nats_url: str, creds: Path | None = None) -> AsyncIterator[Client]:
    """A short-lived connection for one inspector command; BusInspectError when NATS is unreachable."""
    servers = [u.strip() for u in nats_url.split(",") if u.strip()]
    try:
        nc = await connect_or_give_up(servers, name="mohawk-bus", deadline_s=5, creds=creds)
    except (ConnectionError, OSError) as exc:
        raise BusInspectError(str(exc) or f"cannot reach NATS at {nats_url}") from None
    try:
        yield nc
    finally:
        await nc.close()


async def streams(nats_url: str, name: str | None, *, creds: Path | None = None) -> int:
    async with connected(nats_url, creds) as nc:
        jsm = nc.jsm()
        if name is not None:
            try:
                info = await jsm.stream_info(name)
            except NotFoundError:
                raise BusInspectError(f"no stream {name!r}", 2) from None
            print(describe_stream(info))
            return 0
        infos = sorted(await jsm.streams_info(), key=lambda i: i.config.name or "")
        rows = [
            [
                i.config.name,
                ", ".join(i.config.subjects or []),
                i.state.messages,
                human_bytes(i.state.bytes),
                i.state.consumer_count,
                i.config.num_replicas,
            ]
            for i in infos
        ]
        print(format_table(["stream", "subjects", "messages", "size", "consumers", "replicas"], rows))
    return 0


def describe_stream(info: StreamInfo) -> str:
    """`nats stream info`'s two blocks: the configuration and the state."""
    c, s = info.config, info.state
    lines = [
        f"Stream {c.name}",
        "",
        "Configuration:",
        f"  subjects:        {', '.join(c.subjects or [])}",
        f"  storage:         {_name(c.storage)}  replicas: {c.num_replicas}",
        f"  retention:       {_name(c.retention)}  discard: {_name(c.discard)}",
        f"  max messages:    {_limit(c.max_msgs)}  max bytes: {_limit(c.max_bytes, human_bytes)}",
        f"  max age:         {_limit(c.max_age, lambda s: f'{s:g} s')}"
        f"  max message size: {_limit(c.max_msg_size, human_bytes)}",
        f"  duplicate window: {c.duplicate_window:g} s" if c.duplicate_window else "  duplicate window: none",
        "",
        "State:",
        f"  messages:        {s.messages}  size: {human_bytes(s.bytes)}",
        f"  first sequence:  {s.first_seq}  last sequence: {s.last_seq}",
        f"  deleted:         {s.num_deleted or 0}  consumers: {s.consumer_count}",
    ]
    if info.cluster is not None:
        replicas = ", ".join(
            f"{r.name}{'' if r.current else ' (behind)'}" for r in info.cluster.replicas or []
        )
        lines += ["", "Cluster:", f"  leader: {info.cluster.leader}  replicas: {replicas or 'none'}"]
    return "\n".join(lines)


async def consumers(nats_url: str, stream: str, *, creds: Path | None = None) -> int:
    async with connected(nats_url, creds) as nc:
        try:
            infos = await nc.jsm().consumers_info(stream)
        except NotFoundError:
            raise BusInspectError(f"no stream {stream!r}", 2) from None
        rows = [
            [
                i.name,
                "pull" if not i.config.deliver_subject else "push",
                i.config.filter_subject or "(all)",
                i.num_pending,
                i.num_ack_pending,
                i.num_redelivered,
                i.num_waiting,
                i.delivered.stream_seq if i.delivered else 0,
                f"{i.config.ack_wait:g} s" if i.config.ack_wait else "",
            ]
            for i in sorted(infos, key=lambda i: i.name)
        ]
        headers = ["consumer", "kind", "filter", "pending", "ack pending", "redelivered", "waiting pulls"]
        print(format_table([*headers, "last delivered", "ack wait"], rows))
    return 0


async def kv_ls(nats_url: str, bucket: str | None, *, creds: Path | None = None) -> int:
    async with connected(nats_url, creds) as nc:
        js = nc.jetstream()
        if bucket is None:
            infos = [i for i in await nc.jsm().streams_info() if (i.config.name or "").startswith(KV_PREFIX)]
            rows = [
                [
                    (i.config.name or "")[len(KV_PREFIX) :],
                    i.state.messages,
                    human_bytes(i.state.bytes),
                    i.config.max_msgs_per_subject,
                    _limit(i.config.max_age, lambda s: f"{s:g} s"),
                ]
                for i in sorted(infos, key=lambda i: i.config.name or "")
            ]
            print(format_table(["bucket", "values", "size", "history", "ttl"], rows))
            return 0
        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            raise BusInspectError(f"no bucket {bucket!r}", 2) from None
        try:
            keys = sorted(await kv.keys())
        except NotFoundError:  # nats-py: an empty bucket has no keys to list
            keys = []
        for key in keys:
            print(key)
    return 0


async def kv_get(nats_url: str, bucket: str, key: str, *, creds: Path | None = None) -> int:
    async with connected(nats_url, creds) as nc:
        try:
            kv = await nc.jetstream().key_value(bucket)
            entry = await kv.get(key)
        except BucketNotFoundError:
            raise BusInspectError(f"no bucket {bucket!r}", 2) from None
        except (KeyNotFoundError, NotFoundError):
            raise BusInspectError(f"no key {key!r} in bucket {bucket!r}", 2) from None
        print(f"{bucket} > {key} revision {entry.revision} ({human_bytes(len(entry.value or b''))})")
        print(render_value(entry.value or b""))
    return 0


def render_value(value: bytes) -> str:
    """JSON pretty-printed, other text as is, binary as its size and a hex preview."""
    try:
        text = value.decode()
    except UnicodeDecodeError:
        preview = value[:32].hex(" ")
        return f"(binary, {len(value)} bytes: {preview}{' ...' if len(value) > 32 else ''})"
    try:
        return json.dumps(json.loads(text), indent=2)
    except ValueError:
        return text


def human_bytes(n: int | float | None) -> str:
    size = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _limit(value: int | float | None, show: Callable[[Any], str] = str) -> str:
    return "unlimited" if value is None or value <= 0 else show(value)


def _name(setting: object) -> str:
    """An enum setting as the server names it (nats-py gives enums or, from a response, strings)."""
    return str(getattr(setting, "value", setting) or "?")
