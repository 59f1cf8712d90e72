"""The node registry: which shard nodes are live, as their heartbeats on mohawk.v1.hb.<node> say.

Every coordinator replica keeps its own registry (so a standby that takes over already knows the
cluster); a node is live until `node_ttl_s` passes without a heartbeat from it, measured on
this replica's monotonic clock, never the sender's. A stage-0 node lists in its heartbeats the ack
subjects of the requests it runs; when it dies (or comes back as a new process) the registry hands
those out once (`take_handed_back`), and the leader naks them so that the stream redelivers them
at once, a heartbeat timeout after the death instead of an ack wait. The leader mirrors the live
nodes into the KV bucket `mohawk_nodes` (key = node id, value = the heartbeat's JSON) so `nats kv
ls mohawk_nodes` and `mohawk plan --explain` can see them; the bucket's TTL clears what a dead
leader left behind.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog
from google.protobuf.json_format import ParseError
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.errors import NoKeysError
from nats.js.kv import KeyValue

from mohawk_common.bus import names
from mohawk_common.bus.control import decode_json
from mohawk_proto.v1 import bus_pb2

log = structlog.get_logger("mohawk.coordinator.registry")

SHARD_ROLES = ("", "shard")


@dataclass(slots=True)
class NodeRecord:
    """A live node's latest heartbeat, its bytes as sent, and when this replica received it."""

    heartbeat: bus_pb2.Heartbeat
    raw: bytes
    seen_at: float

    @property
    def node_id(self) -> str:
        return self.heartbeat.node_id


class NodeRegistry:
    """Live shard nodes by id; pure bookkeeping (the coordinator feeds it and asks it)."""

    def __init__(
        self,
        node_ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        admit: Callable[[bus_pb2.Heartbeat], bool] = lambda _heartbeat: True,
    ) -> None:
        self.node_ttl_s = node_ttl_s
        self._clock = clock
        self._admit = admit  # the signature check (control_records.py); False drops the heartbeat
        self._nodes: dict[str, NodeRecord] = {}
        self._handed_back: list[str] = []  # ack subjects of requests held by nodes now dead or restarted

    def observe(self, raw: bytes, subject: str | None = None) -> NodeRecord | None:
        """Record one heartbeat; None (and a warning) when it is malformed or not from a shard node."""
        try:
            heartbeat = decode_json(bus_pb2.Heartbeat, raw)
            names.check_id("node id", heartbeat.node_id)
        except (ParseError, ValueError) as exc:
            log.warning("heartbeat dropped", subject=subject, error=str(exc).splitlines()[0])
            return None
        if subject is not None and subject != names.heartbeat_subject(heartbeat.node_id):
            log.warning("heartbeat dropped: node id does not match subject", subject=subject)
            return None
        if heartbeat.role not in SHARD_ROLES or not self._admit(heartbeat):
            return None
        record = NodeRecord(heartbeat, raw, self._clock())
        previous = self._nodes.get(heartbeat.node_id)
        if previous is not None and previous.heartbeat.started_at_ms != heartbeat.started_at_ms:
            log.warning("node restarted", node_id=heartbeat.node_id)
            self._handed_back.extend(previous.heartbeat.held_requests)
        if heartbeat.node_id not in self._nodes:
            log.info(
                "node joined",
                node_id=heartbeat.node_id,
                model=heartbeat.model,
                backend=heartbeat.backend,
                device=heartbeat.device,
                memory_limit_mib=heartbeat.memory_limit_bytes >> 20,
            )
        self._nodes[heartbeat.node_id] = record
        return record

    def expire(self) -> list[str]:
        """Forget nodes silent for `node_ttl_s`; their ids."""
        cutoff = self._clock() - self.node_ttl_s
        dead = [node_id for node_id, record in self._nodes.items() if record.seen_at <= cutoff]
        for node_id in dead:
            record = self._nodes.pop(node_id)
            silent = self._clock() - record.seen_at
            log.warning("node left (heartbeats stopped)", node_id=node_id, silent_s=round(silent, 2))
            self._handed_back.extend(record.heartbeat.held_requests)
        return dead

    def depart(self, node_id: str, reason: str) -> bool:
        """`node_id`'s process left the bus (its connection closed: `departures.py`): forget it now,
        as a heartbeat timeout would later. False if it was not live."""
        record = self._nodes.pop(node_id, None)
        if record is None:
            return False
        log.warning("node left (its connection closed)", node_id=node_id, reason=reason)
        self._handed_back.extend(record.heartbeat.held_requests)
        return True

    def take_handed_back(self) -> list[str]:
        """Ack subjects of the requests that nodes which died or restarted still held (each once)."""
        taken, self._handed_back = self._handed_back, []
        return taken

    def live(self, model: str | None = None) -> dict[str, NodeRecord]:
        """Live nodes (serving `model`, when given), by id."""
        self.expire()
        return {
            node_id: record
            for node_id, record in sorted(self._nodes.items())
            if model is None or record.heartbeat.model == model
        }


class NodeMirror:
    """The leader's copy of the live registry in the `mohawk_nodes` bucket, for operators and tools."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self._written: dict[str, float] = {}  # node id -> seen_at of the heartbeat last written
        self._cleaned = False

    async def sync(self, live: Mapping[str, NodeRecord]) -> None:
        """Write heartbeats newer than what the bucket holds; delete nodes no longer live."""
        if not self._cleaned:
            await self._delete_stale(live)
            self._cleaned = True
        for node_id, record in live.items():
            if self._written.get(node_id) != record.seen_at:
                await self.kv.put(node_id, record.raw)
                self._written[node_id] = record.seen_at
        for node_id in [n for n in self._written if n not in live]:
            await self.kv.delete(node_id)
            del self._written[node_id]

    async def _delete_stale(self, live: Mapping[str, NodeRecord]) -> None:
        """Entries an earlier leader wrote for nodes that are gone (the TTL would clear them later)."""
        try:
            keys = await self.kv.keys()
        except NoKeysError:
            return
        for key in keys:
            if key not in live:
                await self.kv.delete(key)


NAK = b"-NAK"  # JetStream's negative ack: redeliver now


async def nak_requests(nc: Client, ack_subjects: list[str]) -> int:
    """Hand the requests whose ack subjects are `ack_subjects` back to the stream (a nak each);
    how many were not a request's ack subject (and were left alone)."""
    requests = [s for s in ack_subjects if names.is_request_ack_subject(s)]
    for subject in requests:
        with contextlib.suppress(NatsError, TimeoutError):
            await nc.publish(subject, NAK)
    if requests:
        log.warning("requests of a lost stage 0 handed back to the stream", requests=len(requests))
    return len(ack_subjects) - len(requests)
