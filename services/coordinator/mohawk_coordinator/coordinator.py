"""One coordinator replica: registry always, and while it holds the lease, the plan.

Design. Every replica listens to heartbeats and campaigns for the lease; the replica that holds it
reconciles on each heartbeat and every quarter heartbeat interval: it mirrors the live nodes into
KV, and keeps one plan for the served model. It plans afresh only when the set of live node ids
serving the model changes (or there is no plan), never because speeds wobble; a new plan whose
placement equals the current one is not published, so nodes reload only when something they do
changes. A replica that becomes leader first adopts the stored plan when all its stages are still
live and no node would change it, so a coordinator failover alone never makes the cluster
reload. Each write is fenced twice: the lease is checked just before, and the plan key is written
by compare-and-set on the revision this leader last read or wrote, so a deposed leader's write
fails instead of overwriting its successor's. A plan is published `loading`, and re-published with
the same version as `active` once every stage's node heartbeats that version loaded. The model's
shape comes from the same heartbeats (plan_inputs.py): no plan is made before a node has reported it.
No record stops the leader: the plan key's records are parsed, bounded and verified before their
version counts (`publisher.py`), a signed plan older than the highest this replica has seen signed
(`high_water.py`) is a replay, never adopted, and a leader step that fails for any other reason is
logged, counted and tried again at the next tick instead of ending the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from prometheus_client.core import Metric

from mohawk_common.bus import names
from mohawk_common.bus.control_records import RecordVerifier, sign_record
from mohawk_common.bus.heartbeat_freshness import HeartbeatFreshness
from mohawk_common.bus.plan_follower import MAX_PLAN_VERSION
from mohawk_common.bus.security import Security
from mohawk_common.bus.setup import Buckets
from mohawk_common.tasks import cancel_and_wait
from mohawk_coordinator.config import CoordinatorSettings
from mohawk_coordinator.departures import DISCONNECT, Advisory, DepartureWatch
from mohawk_coordinator.election import LeaderElection
from mohawk_coordinator.high_water import PlanHighWater
from mohawk_coordinator.metrics import replica_metrics
from mohawk_coordinator.plan_inputs import (
    ModelShape,
    activate_ready,
    build_plan,
    can_adopt,
    same_placement,
    with_pipelines,
)
from mohawk_coordinator.planner import PlanningError
from mohawk_coordinator.publisher import PlanConflictError, PlanStore
from mohawk_coordinator.quarantine import Quarantine
from mohawk_coordinator.registry import NodeMirror, NodeRecord, NodeRegistry, nak_requests
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2

log = structlog.get_logger("mohawk.coordinator")

TICKS_PER_HEARTBEAT = 4
WARMUP_HEARTBEATS = 1.5  # a new replica hears every live node before it plans


@dataclass(slots=True)
class _Term:
    """What the leader knows during one term; thrown away when leadership is lost or regained."""

    number: int
    mirror: NodeMirror
    has_read: bool = False
    plan: bus_pb2.Plan | None = None
    revision: int = 0
    version: int = 0
    # the live (node id, incarnation) pairs the current plan was decided for
    planned_ids: frozenset[tuple[str, int]] | None = None
    complaints: set[str] = field(default_factory=set)  # problems already logged this term
    quarantined: frozenset[str] = frozenset()  # live nodes left out of plans now


class Coordinator:
    """Runs one replica until `stop()`."""

    def __init__(
        self,
        settings: CoordinatorSettings,
        nc: Client,
        buckets: Buckets,
        *,
        clock: Callable[[], float] = time.monotonic,
        security: Security | None = None,
    ) -> None:
        self.settings = settings
        self.nc = nc
        self.buckets = buckets
        self.security = security
        bundle = security.bundle if security is not None else None
        self._identity = bundle.identity if bundle is not None else None
        self.verifier = RecordVerifier(bundle.trust if bundle is not None else None)
        self.freshness = HeartbeatFreshness()
        self.registry = NodeRegistry(settings.node_ttl_s, clock=clock, admit=self._admit_heartbeat)
        self.departures = DepartureWatch(settings.departure_grace_s, clock)
        self.quarantine = Quarantine(
            clock,
            threshold=settings.quarantine_failures,
            window_s=settings.quarantine_window_s,
            cool_down_s=settings.quarantine_s,
        )
        self.store = PlanStore(buckets.plan, self.verifier, self._reject)
        self.high_water = PlanHighWater(settings.state_path)
        self.num_failed_steps = 0  # leader steps that failed on something other than the bus
        self._clock = clock
        self.election = self._new_election(settings.lease_ttl_s)
        self._wake = asyncio.Event()
        self._stopping = False
        self._term: _Term | None = None
        self._listening_since = 0.0
        # the live (node id, incarnation) set, and since when it is unchanged
        self._seen_ids: frozenset[tuple[str, int]] = frozenset()
        self._seen_since = 0.0
        self._log = log.bind(coordinator_id=settings.coordinator_id)

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    def metrics(self) -> Iterator[Metric]:
        """This replica's own /metrics (`metrics_port`)."""
        term = self._term if self.is_leader else None
        return replica_metrics(
            self.settings.coordinator_id,
            is_leader=self.is_leader,
            live_nodes=len(self.registry.live()),
            plan_version=term.version if term else 0,
            quarantined=len(term.quarantined) if term else 0,
            failed_steps=self.num_failed_steps,
        )

    def stop(self) -> None:
        """Finish the current step, give up the lease and return from `run` (graceful shutdown)."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        """Serve until `stop()`. Cancelling instead is a crash: the lease is left to expire."""
        await self._adopt_bucket_ttl()
        subscription = await self.nc.subscribe(names.HEARTBEAT_WILDCARD, cb=self._on_heartbeat)
        retry_s = self.settings.heartbeat_interval_s
        followers = (
            asyncio.create_task(self._follow_revocations(), name="revocations"),
            asyncio.create_task(
                self.high_water.follow(self.buckets.plan, self.verifier, retry_s, self._plan_key_written)
            ),
        )
        self._listening_since = self._seen_since = self._clock()
        election = asyncio.create_task(self.election.run(), name="election")
        self._log.info(
            "coordinator started", model=self.settings.served_model, placement=self.settings.placement
        )
        try:
            await self._loop()
        except asyncio.CancelledError:
            await _halt(election, subscription, *followers)
            raise
        except BaseException:
            await _halt(election, subscription, *followers)
            await self.election.release()
            raise
        await _halt(election, subscription, *followers)
        await self.election.release()
        self._log.info("coordinator stopped")

    async def _loop(self) -> None:
        tick = self.settings.heartbeat_interval_s / TICKS_PER_HEARTBEAT
        while not self._stopping:
            with contextlib.suppress(TimeoutError):  # not wait_for: 3.11 may swallow a cancel
                async with asyncio.timeout(tick):
                    await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            self.registry.expire()
            for node_id, reason in self.departures.due():
                self.registry.depart(node_id, reason)
            handed_back = self.registry.take_handed_back()
            if not self.election.is_leader:
                self._term = None
                continue
            await self._hand_back(handed_back)
            try:
                await self._lead()
            except (NatsError, TimeoutError) as exc:
                self._log.warning("leader step failed, retrying", error=str(exc) or type(exc).__name__)
            except Exception:  # a bug or a record nothing above caught: never a crash loop
                self.num_failed_steps += 1
                self._log.exception("leader step failed; trying again next tick")

    def heard(self, advisory: Advisory) -> None:
        """A connection advisory (`departures.py`); a departure counts once its grace is over."""
        self.departures.observe(advisory)
        if advisory.kind == DISCONNECT:
            asyncio.get_running_loop().call_later(self.departures.grace_s, self._wake.set)

    async def _lead(self) -> None:
        term = self._term
        if term is None or term.number != self.election.term:
            term = self._term = _Term(self.election.term, NodeMirror(self.buckets.nodes))
        await term.mirror.sync(self.registry.live())
        if self._clock() - self._listening_since < WARMUP_HEARTBEATS * self.settings.heartbeat_interval_s:
            return
        live = {node_id: r.heartbeat for node_id, r in self.registry.live(self.settings.served_model).items()}
        term.quarantined = frozenset(self.quarantine.excluded(live))
        live = {node_id: h for node_id, h in live.items() if node_id not in term.quarantined}
        try:
            shape = ModelShape.from_heartbeats(live.values())
        except PlanningError as exc:
            self._complain_once(term, f"not planning: {exc}")
            return
        if shape is None:
            self._complain_once(term, "waiting for a node to report the model's shape before planning")
            return
        if not term.has_read:
            await self._read_stored(term)
        live_ids = frozenset((node_id, hb.started_at_ms) for node_id, hb in live.items())
        if term.planned_ids is None and can_adopt(term.plan, shape, live, self.settings):
            term.planned_ids = live_ids
            self._log.info(
                "adopted the stored plan", version=term.version, state=term.plan and term.plan.state
            )
        if live_ids != self._seen_ids:
            self._seen_ids, self._seen_since = live_ids, self._clock()
        # a node gone is not coming back to this plan: only joins wait for the set to settle
        departed_only = term.planned_ids is not None and live_ids < term.planned_ids
        settled = departed_only or self._clock() - self._seen_since >= self.settings.plan_settle_s
        expected = self.settings.expected_nodes
        if term.planned_ids is None and expected is not None and len(live_ids) >= expected:
            settled = True  # every node the operator started is here: nothing to wait for
        if term.planned_ids != live_ids and settled:
            await self._replan(term, shape, live)
        active = activate_ready(term.plan, live) if term.plan is not None else None
        if active is not None:
            await self._publish(term, active)

    async def _read_stored(self, term: _Term) -> None:
        """Read the plan key. A record this leader does not adopt (malformed, not a coordinator's,
        or older than its high-water mark) or a deleted key: if this term already had a plan, it is
        written back, pipelines and epochs unchanged, numbered above every version signed so far,
        so no node reloads."""
        stored = await self.store.read(self.high_water.value)
        ours = term.plan
        term.revision, term.version, term.has_read = stored.revision, stored.version, True
        if stored.plan is None and ours is not None:  # a record not adopted, or the key deleted
            restored = bus_pb2.Plan()
            restored.CopyFrom(ours)
            restored.version = stored.version + 1
            self._log.warning("the plan key lost this leader's plan: writing it back")
            await self._publish(term, restored)
            return
        term.plan = with_pipelines(stored.plan) if stored.plan is not None else None
        self.high_water.raise_to(stored.version)

    async def _replan(self, term: _Term, shape: ModelShape, live: dict[str, bus_pb2.Heartbeat]) -> None:
        term.planned_ids = frozenset((node_id, hb.started_at_ms) for node_id, hb in live.items())
        if not live:
            keeping = "keeping the last plan" if term.plan is not None else "nothing to plan yet"
            self._log.warning(
                f"no live nodes serve the model; {keeping}",
                model=self.settings.served_model,
                version=term.version,
            )
            return
        try:
            plan = build_plan(shape, live.values(), self.settings, term.plan)
        except PlanningError as exc:
            self._log.error("no plan for the live nodes", nodes=sorted(live), error=str(exc))
            return
        if term.plan is not None and same_placement(term.plan, plan):
            self._log.info("nodes changed, placement did not", nodes=sorted(live), version=term.version)
            return
        plan.version = term.version + 1
        if plan.version > MAX_PLAN_VERSION:  # 285,000 years of a plan a millisecond
            self._log.error("plan versions exhausted; not publishing", version=term.version)
            return
        for pipeline in plan.pipelines:
            pipeline.epoch = pipeline.epoch or plan.version  # formed by this version
        try:
            await self._publish(term, plan)
        except BaseException:
            # not written (the plan stream may be electing a leader after a host left): plan again
            # next step, or this set of live nodes would never be planned for
            term.planned_ids = None
            raise

    async def _publish(self, term: _Term, plan: bus_pb2.Plan) -> None:
        if not await self.election.verify():
            return
        plan.leader = self.settings.coordinator_id
        del plan.quarantined[:]
        plan.quarantined.extend(sorted(term.quarantined))
        plan.created = plan.created or time.time()
        if self._identity is not None:
            sign_record(plan, self._identity, "plan")
        try:
            revision = await self.store.write(plan, term.revision)
        except PlanConflictError as exc:
            self._log.warning("plan write lost a compare-and-set", error=str(exc))
            if await self.election.verify():  # still ours: someone else wrote it; re-read next step
                term.has_read, term.planned_ids = False, None
            return
        term.plan, term.revision, term.version = plan, revision, plan.version
        self.high_water.raise_to(plan.version)
        self._log.info(
            "plan published",
            version=plan.version,
            state=plan.state,
            stages=[f"{s.pipeline}:{s.node_id}[{s.start},{s.end})" for s in plan.stages],
            active=[p.id for p in plan.pipelines if p.active],
            spares=list(plan.spares),
            standbys=[f"{b.node_id}[{b.start},{b.end})" for b in plan.standbys],
            num_kv_blocks=plan.num_kv_blocks,
            max_model_len=plan.max_model_len,
        )

    async def _hand_back(self, ack_subjects: list[str]) -> None:
        """Nak the requests a dead or restarted stage 0 held: the stream redelivers them now."""
        foreign = await nak_requests(self.nc, ack_subjects)
        if foreign:  # only a request's ack subject may be nak'ed, never one a heartbeat names
            self._reject(AuthenticationError("malformed", f"{foreign} held request(s) not ack subjects"))

    async def _on_heartbeat(self, msg: Msg) -> None:
        record: NodeRecord | None = self.registry.observe(msg.data, msg.subject)
        if record is not None:
            self.quarantine.observe(record.heartbeat)
            self._wake.set()

    def _admit_heartbeat(self, heartbeat: bus_pb2.Heartbeat) -> bool:
        try:
            self.freshness.verify(self.verifier, heartbeat)
        except AuthenticationError as exc:
            self._reject(exc)
            return False
        return True

    def _reject(self, exc: AuthenticationError) -> None:
        if self.security is not None:
            self.security.reject(exc, what="control record")
        else:
            self._log.warning("control record rejected", reason=exc.reason, detail=exc.detail)

    async def _follow_revocations(self) -> None:
        """A revoked node's heartbeats stop verifying, so it leaves the registry and the plans."""
        if self.security is not None:
            await self.security.follow_revocations(self.buckets.pki)

    def _plan_key_written(self, revision: int) -> None:
        """Someone else wrote or deleted the plan key: read it (and restore ours) at once, not at
        this leader's next write, so the nodes and gateways follow a plan all along."""
        term = self._term
        if term is not None and term.has_read and revision != term.revision:
            term.has_read = False
            self._wake.set()

    def _wake_up(self, _leading: bool) -> None:
        self._wake.set()

    def _complain_once(self, term: _Term, problem: str) -> None:
        if problem not in term.complaints:
            term.complaints.add(problem)
            self._log.info(problem)

    def _new_election(self, ttl_s: float) -> LeaderElection:
        settings = self.settings
        return LeaderElection(
            self.buckets.leader, settings.coordinator_id, ttl_s, on_change=self._wake_up, clock=self._clock
        )

    async def _adopt_bucket_ttl(self) -> None:
        """The lease lasts as long as the bucket keeps values, whatever this replica was told."""
        try:
            ttl = (await self.buckets.leader.status()).ttl
        except (NatsError, TimeoutError):
            return
        if ttl and abs(ttl - self.election.ttl_s) > 1e-3:
            self._log.warning(
                "lease bucket has another ttl than configured; using the bucket's",
                bucket_ttl_s=ttl,
                configured_s=self.election.ttl_s,
            )
            self.election = self._new_election(ttl)


async def _halt(election: asyncio.Task[None], subscription: Subscription, *tasks: asyncio.Task[None]) -> None:
    with contextlib.suppress(NatsError, TimeoutError):
        await cancel_and_wait(election, *tasks)
    with contextlib.suppress(NatsError, TimeoutError):
        await subscription.unsubscribe()
