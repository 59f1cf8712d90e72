"""What one process may do on the bus: the publish and subscribe allow lists of its NATS user,
scoped to that process's own id wherever a subject carries it (nats-server enforces them).

`process_permissions(role, process_id, models=...)` gives a process's lists; every subject and bucket
comes from `names`. A process's inbox is `_INBOX.<process id>` (`inbox_prefix`), so replies to its
requests, its JetStream API answers and its KV watchers' messages reach no other process.

    shard        its own heartbeat, telemetry and handshake subjects (it offers on
                 `hs.<peer>.<itself>` and answers on `hs.<itself>.*`); frames into its own
                 stages (`act.<itself>.>`); sending frames and token events (shared: see below);
                 pulling and acking its model's stage-0 consumers; reading the plan, CRL,
                 gateway presence, nodes, leader and slices
    coordinator  reading heartbeats; writing the leader lease, node registry and plan; NAKing
                 requests a lost stage 0 held
    gateway      publishing requests and cancels; its own presence keys (`<gateway id>.*`) and
                 telemetry subject; reading tokens and heartbeats
    telemetry    reading heartbeats, telemetry reports and the buckets
    ops          `mohawk bus` / the NATS CLI: reading every stream, consumer, bucket and subject
    admin        `mohawk pki revoke`, `mohawk slice push`: ops, plus writing the CRL and slices

What stays shared, and why: which node serves which stage is the plan's to say, and a plan comes
after a credential is issued, so a node may publish to any node's activation subjects and any
request's token subject (it subscribes only to its own activations, `act.<its id>.>`). Every
activation frame is sealed with the pair of nodes' channel key and every token event with its
request's key, so a node reads and forges nothing there; what it can do is drop or delay what it was
sent, as any stage can. Likewise any node serving a model may pull that model's requests (which node
is stage 0 is the plan's choice); a node of another model may not. No role may delete a consumer
(another process's KV watcher): ephemeral consumers go on their own once idle.
"""

from __future__ import annotations

from collections.abc import Sequence

from mohawk_common.bus import names
from mohawk_common.bus.nats_jwt import UserPermissions

ROLES = ("coordinator", "shard", "gateway", "telemetry", "ops", "admin")
INBOX_ROOT = "_INBOX"
MAX_ROUTES = 64  # routed stage-0 consumers (`stage0_consumer(model, route)`) a shard user may pull
_API = "$JS.API"


def inbox_prefix(process_id: str) -> str:
    """The inbox prefix of a process's connection: only its own user may subscribe under it."""
    return f"{INBOX_ROOT}.{names.check_id('process id', process_id)}"


def process_permissions(role: str, process_id: str, *, models: Sequence[str] = ()) -> UserPermissions:
    """The allow lists of process `process_id` in `role` (a shard node: serving `models`; none: any
    model, as its certificate then says)."""
    names.check_id("process id", process_id)
    if role == "shard":
        return _shard(process_id, models)
    rules = {
        "coordinator": _coordinator,
        "gateway": _gateway,
        "telemetry": _telemetry,
        "ops": _ops,
        "admin": _admin,
    }
    if role not in rules:
        raise ValueError(f"unknown NATS role {role!r}; one of {', '.join(ROLES)}")
    return rules[role](process_id)


def _inbox(process_id: str) -> str:
    return f"{inbox_prefix(process_id)}.>"


def _coordinator(process_id: str) -> UserPermissions:
    return UserPermissions(
        publish=(
            *_adopt(),
            *_kv_read(*_BUCKETS),
            *_kv_write(names.LEADER_BUCKET, names.NODES_BUCKET, names.PLAN_BUCKET),
            f"$JS.ACK.{names.REQUESTS_STREAM}.>",  # NAK what a lost stage 0 held
        ),
        subscribe=(names.HEARTBEAT_WILDCARD, _inbox(process_id)),
    )


def _shard(node_id: str, models: Sequence[str]) -> UserPermissions:
    return UserPermissions(
        publish=(
            *_adopt(),
            names.heartbeat_subject(node_id),
            names.telemetry_of(node_id),
            names.handshakes_from(node_id),  # its offers to any peer
            f"{names.PREFIX}.act.>",
            names.TOKENS_WILDCARD,
            *(_stage0_pull(models) if models else _any_stage0_pull()),
            *_stream_read(names.TOKENS_STREAM),  # a new stage 0 reads back emitted tokens
            *_kv_read(*_BUCKETS),
            *_object_read(names.SLICES_BUCKET),
        ),
        subscribe=(
            names.activations_to(node_id),  # frames into its own stages only
            names.CANCEL_WILDCARD,
            names.handshakes_to(node_id),  # offers to it
            _inbox(node_id),
        ),
        allow_responses=True,  # handshake replies
    )


def _stage0_pull(models: Sequence[str]) -> tuple[str, ...]:
    """Creating, reading and pulling `models`' shared and routed stage-0 consumers, and acking what
    they deliver; nothing of another model's."""
    requests = names.REQUESTS_STREAM
    consumers = [
        consumer
        for model in dict.fromkeys(models)
        for consumer in (
            names.stage0_consumer(model),
            *(names.stage0_consumer(model, route) for route in range(MAX_ROUTES)),
        )
    ]
    subjects = [f"{_API}.CONSUMER.LIST.{requests}", f"{_API}.CONSUMER.NAMES.{requests}"]
    for consumer in consumers:  # nats-py creates a filtered durable as CREATE.<stream>.<name>.<filter>
        subjects += [
            f"{_API}.CONSUMER.CREATE.{requests}.{consumer}.>",
            f"{_API}.CONSUMER.INFO.{requests}.{consumer}",
            f"{_API}.CONSUMER.MSG.NEXT.{requests}.{consumer}",
            f"$JS.ACK.{requests}.{consumer}.>",
        ]
    return tuple(subjects)


def _any_stage0_pull() -> tuple[str, ...]:
    """A node certified for any model may pull any stage-0 consumer."""
    requests = names.REQUESTS_STREAM
    return (
        f"{_API}.CONSUMER.LIST.{requests}",
        f"{_API}.CONSUMER.NAMES.{requests}",
        f"{_API}.CONSUMER.CREATE.{requests}.*.>",
        f"{_API}.CONSUMER.INFO.{requests}.*",
        f"{_API}.CONSUMER.MSG.NEXT.{requests}.*",
        f"$JS.ACK.{requests}.>",
    )


def _gateway(gateway_id: str) -> UserPermissions:
    return UserPermissions(
        publish=(
            *_adopt(),
            names.REQUESTS_WILDCARD,
            names.CANCEL_WILDCARD,
            names.telemetry_of(gateway_id),
            *_stream_read(names.TOKENS_STREAM),
            *_kv_read(*_BUCKETS),
            f"$KV.{names.GATEWAYS_BUCKET}.{names.presence_keys_of(gateway_id)}",
        ),
        subscribe=(names.TOKENS_WILDCARD, names.HEARTBEAT_WILDCARD, _inbox(gateway_id)),
    )


def _telemetry(process_id: str) -> UserPermissions:
    return UserPermissions(
        publish=(*_adopt(), *_kv_read(*_BUCKETS)),
        subscribe=(names.HEARTBEAT_WILDCARD, names.TELEMETRY_WILDCARD, _inbox(process_id)),
    )


def _ops(process_id: str) -> UserPermissions:
    return UserPermissions(
        publish=(
            f"{_API}.INFO",
            f"{_API}.STREAM.NAMES",
            f"{_API}.STREAM.LIST",
            f"{_API}.STREAM.INFO.*",
            f"{_API}.CONSUMER.NAMES.*",
            f"{_API}.CONSUMER.LIST.*",
            f"{_API}.CONSUMER.INFO.*.*",
            *_kv_read(*_BUCKETS),
        ),
        # a person's tools (the NATS CLI among them) pick their own inboxes
        subscribe=(f"{names.PREFIX}.>", f"{INBOX_ROOT}.>"),
    )


def _admin(process_id: str) -> UserPermissions:
    ops = _ops(process_id)
    slices = _object_stream(names.SLICES_BUCKET)
    return UserPermissions(
        publish=(
            *ops.publish,
            *_adopt(),  # `pki revoke` adopts every bucket, as a service does
            *_kv_write(names.PKI_BUCKET),
            *_object_read(names.SLICES_BUCKET),
            f"{_API}.STREAM.CREATE.{slices}",
            f"{_API}.STREAM.PURGE.{slices}",  # replacing an object purges its old chunks
            f"$O.{names.SLICES_BUCKET}.>",
        ),
        subscribe=ops.subscribe,
    )


_BUCKETS = (
    names.LEADER_BUCKET,
    names.NODES_BUCKET,
    names.PLAN_BUCKET,
    names.PKI_BUCKET,
    names.GATEWAYS_BUCKET,
)


def _kv_stream(bucket: str) -> str:
    return f"KV_{bucket}"


def _object_stream(bucket: str) -> str:
    return f"OBJ_{bucket}"


def _adopt() -> tuple[str, ...]:
    """Finding, else creating, Mohawk's streams and KV buckets (what every service does at start)."""
    streams = (names.REQUESTS_STREAM, names.TOKENS_STREAM, *(_kv_stream(b) for b in _BUCKETS))
    return tuple(f"{_API}.STREAM.{verb}.{stream}" for stream in streams for verb in ("INFO", "CREATE"))


def _stream_read(stream: str) -> tuple[str, ...]:
    """Reading `stream`: its info, single messages, and ordered consumers (watchers) with their
    flow control; deleting none."""
    return (
        f"{_API}.STREAM.INFO.{stream}",
        f"{_API}.STREAM.MSG.GET.{stream}",
        f"{_API}.DIRECT.GET.{stream}",
        f"{_API}.DIRECT.GET.{stream}.>",
        f"{_API}.CONSUMER.CREATE.{stream}",
        f"{_API}.CONSUMER.CREATE.{stream}.>",
        f"{_API}.CONSUMER.INFO.{stream}.*",
        f"$JS.FC.{stream}.>",
    )


def _kv_read(*buckets: str) -> tuple[str, ...]:
    return tuple(subject for bucket in buckets for subject in _stream_read(_kv_stream(bucket)))


def _kv_write(*buckets: str) -> tuple[str, ...]:
    return tuple(f"$KV.{bucket}.>" for bucket in buckets)


def _object_read(bucket: str) -> tuple[str, ...]:
    # nats-py finds an object's chunk stream by subject (STREAM.NAMES) before reading it
    return (*_stream_read(_object_stream(bucket)), f"{_API}.STREAM.NAMES")
