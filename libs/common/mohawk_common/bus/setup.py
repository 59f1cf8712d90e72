"""Create (or adopt) Mohawk's JetStream streams and KV buckets; every service calls this at start.

Requests live on a work-queue stream with file storage: a message stays until stage 0 acks it when
the request has finished (or failed for good), so a dying pipeline loses nothing; the message id is
the request id, so a retried publish within the duplicate window is stored once. Its `max_msgs`
with discard-new is the bound on accepted-but-unfinished requests: past it a publish is refused
and the gateway answers 429. Token events go to a limits stream kept for a few minutes: the
gateway reads them live, and a new stage 0 that takes over a request reads back what was already
emitted, so generation continues at the next index.

Every stream and bucket is bounded in bytes (and the streams in messages) when Mohawk creates it,
so no client the bus lets publish can fill the server's disk: the request stream refuses new
requests past its bounds (the gateway answers 429), the token stream drops its oldest events
first (events older than a resume needs: keep `tokens_max_bytes` above what the cluster emits in
`tokens_max_age_s`), and a bucket refuses writes past its bytes. JetStream reserves each bound
against its storage limit (by default 75% of the free disk) when the stream is created.

A replicated stream (or bucket) is returned only once its Raft group has a leader: until then
JetStream answers a publish to it with "no responders", so a service that wrote the moment
`ensure_*` returned would fail on a cluster that had just created the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import structlog
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError
from nats.js.kv import KeyValue

from mohawk_common.bus import names

log = structlog.get_logger("mohawk.bus")

T = TypeVar("T")
_FORMING_ATTEMPTS = 5  # 0.5 + 1 + 2 + 4 s of waiting at most
_FORMING_FIRST_RETRY_S = 0.5
_LEADER_WAIT_S = 30.0  # a new R3 group elects within a few seconds even on a loaded 2-core host
_LEADER_POLL_S = 0.1
MIB = 1 << 20
REQUESTS_MAX_BYTES = 256 * MIB  # sealed prompts; with max_queued_requests, up to 256 KiB each
TOKENS_MAX_BYTES = 1024 * MIB  # a few hundred bytes an event: millions within the max age
BUCKET_MAX_BYTES = 16 * MIB  # each KV bucket (plans, heartbeats, leases, CRL, gateways)
NODE_TTL_S = 3.0  # a node silent this long is dead (3 heartbeats); BusSettings.node_ttl_s's default
DUPLICATE_WINDOW_S = 120.0  # the request stream stores a request id once within this window


@dataclass(frozen=True, slots=True)
class BusLimits:
    replicas: int = 1  # 3 on a 3-server NATS cluster
    max_queued_requests: int = 1024  # accepted and unfinished; past it the gateway answers 429
    duplicate_window_s: float = DUPLICATE_WINDOW_S
    tokens_max_age_s: float = 600.0
    requests_max_bytes: int = REQUESTS_MAX_BYTES
    tokens_max_bytes: int = TOKENS_MAX_BYTES
    tokens_max_msgs: int = 10_000_000
    bucket_max_bytes: int = BUCKET_MAX_BYTES
    bucket_max_value_bytes: int = 1 * MIB
    lease_ttl_s: float = 3.0
    node_ttl_s: float = NODE_TTL_S
    gateway_ttl_s: float = 4.0  # a gateway's presence lapses this long after its last refresh


@dataclass(frozen=True, slots=True)
class Buckets:
    leader: KeyValue
    nodes: KeyValue
    plan: KeyValue
    pki: KeyValue
    gateways: KeyValue


async def ensure_streams(js: JetStreamContext, limits: BusLimits = BusLimits()) -> None:
    await _ensure_stream(
        js,
        StreamConfig(
            name=names.REQUESTS_STREAM,
            subjects=[names.REQUESTS_WILDCARD],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            max_msgs=limits.max_queued_requests,
            max_bytes=limits.requests_max_bytes,
            discard=DiscardPolicy.NEW,
            duplicate_window=limits.duplicate_window_s,
            num_replicas=limits.replicas,
        ),
    )
    await _ensure_stream(
        js,
        StreamConfig(
            name=names.TOKENS_STREAM,
            subjects=[names.TOKENS_WILDCARD],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=limits.tokens_max_age_s,
            max_bytes=limits.tokens_max_bytes,
            max_msgs=limits.tokens_max_msgs,
            discard=DiscardPolicy.OLD,
            num_replicas=limits.replicas,
        ),
    )


async def ensure_buckets(js: JetStreamContext, limits: BusLimits = BusLimits()) -> Buckets:
    def bucket(name: str, *, ttl: float | None = None, history: int = 1) -> Awaitable[KeyValue]:
        config = KeyValueConfig(
            bucket=name,
            ttl=ttl,
            history=history,
            replicas=limits.replicas,
            max_bytes=limits.bucket_max_bytes,
            max_value_size=limits.bucket_max_value_bytes,
        )
        return _ensure_bucket(js, config)

    leader = await bucket(names.LEADER_BUCKET, ttl=limits.lease_ttl_s)
    nodes = await bucket(names.NODES_BUCKET, ttl=limits.node_ttl_s)
    plan = await bucket(names.PLAN_BUCKET, history=16)
    pki = await bucket(names.PKI_BUCKET, history=8)
    gateways = await bucket(names.GATEWAYS_BUCKET, ttl=limits.gateway_ttl_s)
    return Buckets(leader, nodes, plan, pki, gateways)


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """Create the stream unless it exists; an existing one is adopted as the operator configured it."""
    await _while_forming(lambda: _ensure_stream_once(js, config), config.name or "")
    await _await_leader(js, config.name or "", config.num_replicas or 1)


async def _ensure_bucket(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    kv = await _while_forming(lambda: _ensure_bucket_once(js, config), config.bucket)
    await _await_leader(js, f"KV_{config.bucket}", config.replicas)
    return kv


async def _await_leader(js: JetStreamContext, stream: str, replicas: int) -> None:
    """Return once the replicated `stream` reports a leader; raise TimeoutError if none is elected
    within `_LEADER_WAIT_S`. A single-replica stream (asked for, or as found) leads itself."""
    if replicas <= 1:
        return
    deadline = asyncio.get_running_loop().time() + _LEADER_WAIT_S
    while True:
        try:
            info = await js.stream_info(stream)
            if (info.config.num_replicas or 1) <= 1:  # an adopted stream the operator made R1
                return
            if info.cluster is not None and info.cluster.leader:
                return
        except (NatsTimeoutError, ServiceUnavailableError):
            pass  # the group is still forming; ask again
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"JetStream stream {stream} has no leader after {_LEADER_WAIT_S:.0f} s")
        await asyncio.sleep(_LEADER_POLL_S)


async def _while_forming(attempt: Callable[[], Awaitable[T]], what: str) -> T:
    """`attempt()`, again while JetStream answers busy or late: a replicated stream that several
    services create at once answers with timeouts until its Raft group has formed."""
    delay = _FORMING_FIRST_RETRY_S
    for tries in range(1, _FORMING_ATTEMPTS + 1):
        try:
            return await attempt()
        except (NatsTimeoutError, ServiceUnavailableError) as exc:
            if tries == _FORMING_ATTEMPTS:
                raise
            log.info("jetstream busy, retrying", what=what, error=type(exc).__name__, retry_in_s=delay)
            await asyncio.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


async def _ensure_stream_once(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.stream_info(config.name or "")
        return
    except NotFoundError:
        pass
    try:
        await js.add_stream(config)
        log.info("stream created", stream=config.name)
    except BadRequestError:  # created by another service between our two calls
        await js.stream_info(config.name or "")


async def _ensure_bucket_once(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    try:
        return await js.key_value(config.bucket)
    except (NotFoundError, BadRequestError):
        try:
            return await js.create_key_value(config)
        except BadRequestError:  # created concurrently
            return await js.key_value(config.bucket)
