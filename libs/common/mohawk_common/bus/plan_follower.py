"""Which plan records a process obeys, and whether the plan it holds is served by live nodes.

Design. The plan key can be written by anyone the bus lets write it, and it outlives the processes
that wrote it (JetStream keeps it on disk across restarts). So a reader takes a plan only when:
- it parses, its version is in bounds (1 to `MAX_PLAN_VERSION`), and it is for the reader's model;
- its signature verifies, by a coordinator certificate naming the plan's `leader`
  (`control_records.py`); an unsigned or forged record is counted and ignored;
- it is not older than the plan the reader already follows: a lower version, or the same version
  with fewer active pipelines (a recorded `loading` copy replayed after `active`), is a replay.
Each stage of a plan names the incarnation of the node it was placed on (`node_started_at_ms`,
the node's heartbeat's `started_at_ms`), so a plan from an earlier run of the cluster, read back
from disk after a restart, names incarnations that no longer exist: a node never loads a stage
placed on an earlier run of itself (`stage_for`), and a gateway is ready only when a pipeline of
the plan is active and every one of its nodes heartbeats now, as the incarnation the plan names,
with its stage loaded (`serving_reason`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from google.protobuf.json_format import ParseError

from mohawk_common.bus import names
from mohawk_common.bus.control import decode_json
from mohawk_common.bus.control_records import RecordVerifier
from mohawk_common.bus.heartbeat_freshness import HeartbeatFreshness
from mohawk_common.bus.pipelines import pipelines, placed_on
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2

Reject = Callable[[AuthenticationError], None]

# The highest version a plan may carry: exact in JSON, and a coordinator publishing a plan every
# millisecond would take 285,000 years to reach it. A record above it (or at or below 0) is
# malformed, so no writer of the key can exhaust the versions the coordinators count up through.
MAX_PLAN_VERSION = 2**53 - 1


def parse_plan(data: bytes) -> bus_pb2.Plan:
    """The plan a record of the plan key holds; AuthenticationError("malformed") when it does not
    parse or its version is out of bounds."""
    try:
        plan = decode_json(bus_pb2.Plan, data)
    except (ParseError, ValueError) as exc:
        raise AuthenticationError("malformed", f"plan record: {str(exc).splitlines()[0]}") from exc
    if not 0 < plan.version <= MAX_PLAN_VERSION:
        raise AuthenticationError("malformed", f"plan version {plan.version} is out of bounds")
    return plan


def verified_plan(data: bytes, verifier: RecordVerifier) -> bus_pb2.Plan:
    """The plan in `data`, parsed, in bounds and signed by a coordinator; AuthenticationError else."""
    plan = parse_plan(data)
    verifier.verify(plan, "plan")
    return plan


def _order(plan: bus_pb2.Plan) -> tuple[int, int]:
    return plan.version, sum(1 for p in pipelines(plan) if p.active)


class PlanFollower:
    """Admits plan records for one model: signed by a coordinator, never older than the last."""

    def __init__(self, model: str | None, verifier: RecordVerifier, reject: Reject) -> None:
        self.model = model
        self.verifier = verifier
        self.reject = reject
        self.latest: bus_pb2.Plan | None = None

    def admit(self, data: bytes) -> bus_pb2.Plan | None:
        """The plan in `data` when this process may obey it, else None (and a counted rejection
        unless the record is simply for another model)."""
        try:
            plan = parse_plan(data)
        except AuthenticationError as exc:
            self.reject(exc)
            return None
        if self.model is not None and plan.model and not names.same_model(plan.model, self.model):
            return None
        try:
            self.verifier.verify(plan, "plan")
        except AuthenticationError as exc:
            self.reject(exc)
            return None
        latest = self.latest
        if latest is not None and _order(plan) < _order(latest):
            self.reject(
                AuthenticationError(
                    "replayed", f"plan version {plan.version} is older than version {latest.version}"
                )
            )
            return None
        self.latest = plan
        return plan


def stage_for(plan: bus_pb2.Plan, node_id: str, started_at_ms: int) -> bus_pb2.PlanStage | None:
    """The stage `plan` places on this node; None when none, or when it was placed on an earlier
    incarnation of the node (a plan from before the node restarted)."""
    for stage in plan.stages:
        if stage.node_id == node_id:
            return stage if placed_on(stage, started_at_ms) else None
    return None


def placed_on_earlier_run(plan: bus_pb2.Plan, node_id: str, started_at_ms: int) -> bool:
    """Whether `plan` names this node, but an earlier incarnation of it."""
    return any(s.node_id == node_id for s in plan.stages) and stage_for(plan, node_id, started_at_ms) is None


@dataclass(frozen=True, slots=True)
class LiveNode:
    heartbeat: bus_pb2.Heartbeat
    seen_at: float  # the reader's monotonic clock


class LiveNodes:
    """The latest verified heartbeat of each shard node, as a gateway or telemetry hears them."""

    def __init__(
        self, verifier: RecordVerifier, reject: Reject, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.verifier = verifier
        self.reject = reject
        self.clock = clock
        self.freshness = HeartbeatFreshness()
        self.nodes: dict[str, LiveNode] = {}

    def observe(self, data: bytes, subject: str) -> LiveNode | None:
        """Record one heartbeat from `subject`; None (counted) when it fails to parse, names
        another node than its subject, fails its signature or is a replay (`heartbeat_freshness`)."""
        try:
            heartbeat = decode_json(bus_pb2.Heartbeat, data)
        except (ParseError, ValueError):
            self.reject(AuthenticationError("malformed", f"heartbeat on {subject}"))
            return None
        try:
            expected = names.heartbeat_subject(heartbeat.node_id)
        except ValueError:  # not a usable node id
            expected = ""
        if subject != expected:
            self.reject(AuthenticationError("untrusted", f"heartbeat of {heartbeat.node_id!r} on {subject}"))
            return None
        try:
            self.freshness.verify(self.verifier, heartbeat)
        except AuthenticationError as exc:
            self.reject(exc)
            return None
        node = LiveNode(heartbeat, self.clock())
        self.nodes[heartbeat.node_id] = node
        return node

    def serving_reason(self, plan: bus_pb2.Plan, ttl_s: float) -> str | None:
        return serving_reason(plan, self.nodes, self.clock(), ttl_s)


def serving_reason(plan: bus_pb2.Plan, live: Mapping[str, LiveNode], now: float, ttl_s: float) -> str | None:
    """None when some active pipeline of `plan` has every node heartbeating (within `ttl_s`), as
    the incarnation the plan names, with its stage loaded; else why not."""
    active = [p for p in pipelines(plan) if p.active and p.stages]
    if not active:
        return f"plan version {plan.version} is {plan.state or 'not active'}, not active"
    missing = ""
    for pipeline in active:
        for stage in pipeline.stages:
            node = live.get(stage.node_id)
            if node is None or now - node.seen_at > ttl_s:
                missing = f"node {stage.node_id} of plan version {plan.version} sends no heartbeat"
                break
            hb = node.heartbeat
            if not placed_on(stage, hb.started_at_ms):
                missing = f"node {stage.node_id} restarted since plan version {plan.version} was made"
                break
            if not hb.loaded:
                missing = f"node {stage.node_id} has not loaded its stage of plan version {plan.version}"
                break
        else:
            return None
    return missing
