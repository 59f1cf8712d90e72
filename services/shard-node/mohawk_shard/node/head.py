"""Stage 0 of a pipeline: takes requests off the durable stream and keeps steps flowing through the stages.

Design. Stage 0 owns the scheduler, through the same `EngineCore` the in-process engine drives
(request table, validation, step batches, token application); this module adds only the bus:
pulling, acking and keeping requests alive, cancel messages, and frames to and from the stages.
It pulls a request from the work-queue stream only while the scheduler has room
(`Scheduler.num_admittable`: the free sequence slots, and once they are all taken a queue of up to
`max_waiting` for fair share to choose from): that is the backpressure, and whatever it does not
pull waits, durable, on the stream. It pulls from two consumers: the requests routed to its own pipeline
(round robin, prefix affinity) and the model's shared ones, which every pipeline's stage 0 pulls
(least-queue routing); the stage 0 of the lowest active pipeline also drains routes whose pipeline
is no longer active. Each step the scheduler picks runs through stage 0's layers and its hidden
states go to stage 1 as activation frames; the last stage samples, publishes the token events
and sends back `StepResult`s, which append the tokens (or end the sequences) here. Up to one step
per stage is in flight: a sequence waiting for its token sits out the next steps by itself, and
each step takes at most its share of the unfinished sequences, so the running set splits into
micro-batches that keep every stage busy. A request leaves the stream (ack) only when it has
finished; while it runs, stage 0 keeps extending its ack deadline; when the plan changes, every
unfinished request is handed back (nak) and the new stage 0 replays its emitted tokens from the
token stream and continues at the next index. A cancel frees the sequence's KV blocks at once.
Every step sent down the pipeline has a deadline (`StepDeadlines`: a floor plus a multiple of the
measured round trip). A step whose result has not come by then (its frames were lost: a NATS
server restarted, a stage died mid-step) is given up: its sequences are freed and resumed from the
tokens the token stream holds for them, as after a plan change, and a result that still comes late
is ignored. A request whose steps expire `max_resumes` times in a row without a token in between
ends with an error event (503), so no request waits for its client's timeout: the bound is about
`max_resumes × (floor + the expected round trip × factor)`, 15–20 s with the defaults. A request
names the gateway process that waits for it and its deadline: one whose gateway's presence key has
lapsed (`GatewayPresence`), or whose deadline has passed, is cancelled and leaves the stream; one
that is past its deadline when pulled, or entered the stream more than the duplicate window after
it was made (a recorded request published again), is refused at admission (`check_fresh`, stale).
A request also names its tenant, priority, weight and latency budget: what this stage 0 has pulled
waits in the scheduler's fair queue, which admits it in fair-share order, and every step's time
from its start to its result feeds the core's latency-budget cap. With tracing on, each request
gets a span here (`StageTraces`), the child of the gateway's, from its pull to its end; the first
frame of its sequence names that span, so stage 1's span is its child.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from mohawk_common.bus import names
from mohawk_common.bus.control_records import RecordVerifier
from mohawk_common.bus.frames import KIND_RESULT, read_result_payload
from mohawk_common.bus.pipelines import pipeline_id
from mohawk_common.bus.requests import cancel_tag, check_fresh, open_request
from mohawk_common.bus.security import Security
from mohawk_common.errors import InvalidRequestError
from mohawk_common.tasks import cancel_and_wait
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.seal import EventBox
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.engine.core import EngineCore
from mohawk_shard.engine.scheduler import Scheduler
from mohawk_shard.engine.sequence import Sequence as Seq
from mohawk_shard.engine.stage import Stage, StepBatch
from mohawk_shard.node.gateways import ORPHAN_CHECK_S, GatewayPresence
from mohawk_shard.node.hops import HopStats
from mohawk_shard.node.link import StageLink
from mohawk_shard.node.recovery import read_emitted
from mohawk_shard.node.resume_budget import ResumeBudget
from mohawk_shard.node.snapshot import QueueSnapshot, StageSnapshot, StepStats, stage_snapshot
from mohawk_shard.node.step_deadlines import StepDeadlines
from mohawk_shard.node.tokens import TokenPublisher, event_box, publish_error
from mohawk_shard.node.traces import StageTraces
from mohawk_shard.node.wire import Joining, qos_from_proto, sampling_from_proto, step_batch_to_proto

log = structlog.get_logger("mohawk.shard.head")

_IDLE_WAIT_S = 0.5
_DEADLINE_TICK_S = 0.25
_DRAIN_EVERY_S = 2.0
_PULL_RETRY_S = 0.5
_FULL_WAIT_S = 0.02  # the scheduler has no room: look again this soon
_PULL_WAIT_S = 1.0  # a fetch on the route's own consumer waits this long for work
_DRAIN_PULL_WAIT_S = 0.2  # a fetch on another route's consumer (drained between steps) waits less
_KEEP_ALIVES_PER_ACK_WAIT = 3  # a held request's +WPI goes out this many times per ack wait
# a request this stage 0 cannot open yet (sealed to a key it has not adopted: a gateway saw the
# new sealing key a moment earlier) goes back to the stream this many times before it is refused
UNOPENED_REDELIVERIES = 5
UNOPENED_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class _Delivery:
    """A running request's bus side: its message on the work queue and its token-event key."""

    msg: Msg
    token_key: bytes
    box: EventBox | None
    gateway: str = ""  # the submitting gateway process ("" = not tracked)
    deadline: float = 0.0  # unix seconds; 0 = none
    traceparent: str = ""  # the gateway's span of the request ("" = not traced)


@dataclass(frozen=True, slots=True)
class _InflightStep:
    batch: StepBatch
    started: float  # time.monotonic() when stage 0 began it


class HeadDriver:
    def __init__(
        self,
        *,
        nc: Client,
        js: JetStreamContext,
        link: StageLink,
        security: Security,
        plan: bus_pb2.Plan,
        stage: Stage,
        scheduler: Scheduler,
        executor: Executor,
        vocab_size: int,
        tokens: TokenPublisher | None,
        max_inflight_steps: int | None,
        ack_wait_s: float,
        step_deadline_floor_s: float = 5.0,
        max_resumes: int = 3,
        max_waiting: int = 1024,
        traces: StageTraces | None = None,
    ) -> None:
        self.nc, self.js, self.plan = nc, js, plan
        self.stage_index = 0  # every role has one (the node, its metrics and reports read it)
        self.link, self.security = link, security
        self.stage, self.scheduler, self.executor = stage, scheduler, executor
        self.core = EngineCore(scheduler, vocab_size=vocab_size, on_finish=self._forget)
        self.tokens = tokens  # set when this node is also the last stage
        self.num_stages = len(plan.stages)
        self.max_inflight = max_inflight_steps or self.num_stages
        self.ack_wait_s = ack_wait_s
        self.max_waiting = max_waiting
        self.num_steps = 0  # steps started here (the node's idle detection watches it)
        self.stats = StepStats()  # for the telemetry service
        self.traces = traces if traces is not None else StageTraces.off()
        self._deliveries: dict[str, _Delivery] = {}
        self._inflight_steps: dict[int, _InflightStep] = {}
        self.deadlines = StepDeadlines(floor_s=step_deadline_floor_s)
        self.resumes = ResumeBudget(max_resumes)
        self._gateways = GatewayPresence(
            js,
            verifier=RecordVerifier(security.bundle.trust if security.bundle is not None else None),
            reject=lambda exc: security.reject(exc, what="gateway presence"),
        )
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._pending_acks: set[asyncio.Task[None]] = set()
        self.hops = HopStats()
        self.num_failed_steps = 0  # steps stage 0 itself could not run (heartbeats report them)
        self._subs: list[Any] = []
        self._pulls: list[JetStreamContext.PullSubscription] = []
        self.route = pipeline_id(plan)  # requests routed to this pipeline come first
        self.active_routes: set[int] = {self.route}  # the service keeps these two current
        self.drains_routes = False
        self._log = log.bind(plan=plan.version)

    @property
    def num_expired_steps(self) -> int:
        """Steps given up waiting for (their deadline passed), since this role started."""
        return self.deadlines.num_expired

    def stage_snapshot(self) -> StageSnapshot:
        """Stage 0's part of the node's snapshot, its queue included."""
        queue = QueueSnapshot(len(self.scheduler.waiting), len(self.scheduler.running), self.kv_blocks_used)
        return stage_snapshot(self.plan, self.stage_index, self.stats, self.hops, queue)

    @property
    def kv_blocks_used(self) -> int:
        """KV blocks handed out to running sequences (every stage of the pipeline holds the same)."""
        return self.plan.num_kv_blocks - self.scheduler.block_manager.num_free_blocks

    def held_acks(self, limit: int) -> list[str]:
        """Ack subjects of (at most `limit` of) the requests this stage 0 holds, for its heartbeat."""
        return [d.msg.reply for d in itertools.islice(self._deliveries.values(), limit) if d.msg.reply]

    async def start(self) -> None:
        model = self.plan.model
        await self.link.start()
        if self.num_stages > 1:
            try:
                await self.link.connect_neighbours()
            except Exception as exc:  # a peer still starting: the first step handshakes again
                self._log.warning("neighbours not reached yet", error=repr(exc))
        self._pulls = [await self._consumer(self.route), await self._consumer(None)]
        self._subs.append(await self.nc.subscribe(names.CANCEL_WILDCARD, cb=self._on_cancel))
        if self.tokens is None:
            subject = names.activation_subject(self.plan.version, pipeline_id(self.plan), 0)
            self._subs.append(await self.nc.subscribe(subject, cb=self._on_result))
        self._tasks = [
            *(asyncio.create_task(self._pull_loop(pull)) for pull in self._pulls),
            asyncio.create_task(self._drain_loop()),
            asyncio.create_task(self._step_loop()),
            asyncio.create_task(self._keep_alive_loop()),
            asyncio.create_task(self._deadline_loop()),
            asyncio.create_task(self._orphan_loop()),
        ]
        self._log.info("stage 0 serving", model=model, stages=self.num_stages)

    async def stop(self) -> None:
        """Stop stepping and hand every unfinished request back to the stream for the next stage 0."""
        try:
            await cancel_and_wait(*self._tasks)
        except Exception as exc:  # a loop that had died already: stopping (and the switch) go on
            self._log.error("a stage 0 loop had failed", error=repr(exc))
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for pull in self._pulls:
            with contextlib.suppress(Exception):
                await pull.unsubscribe()
        for delivery in list(self._deliveries.values()):
            with contextlib.suppress(Exception):
                await delivery.msg.nak()
        await self.link.stop()
        self.traces.end_all()
        self._log.info("stage 0 stopped", handed_back=len(self._deliveries))
        self._deliveries.clear()

    # -- admission -----------------------------------------------------------------------------

    async def _consumer(self, route: int | None) -> JetStreamContext.PullSubscription:
        """The durable consumer of the model's shared requests (None) or of those routed to `route`."""
        model = self.plan.model
        return await self.js.pull_subscribe(
            names.request_subject(model, route),
            durable=names.stage0_consumer(model, route),
            stream=names.REQUESTS_STREAM,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait_s, max_ack_pending=-1
            ),
        )

    async def _pull_loop(self, pull: JetStreamContext.PullSubscription) -> None:
        """Pull while the scheduler has room (the route's loop and the shared one may each take it:
        at most twice the room is admitted, and the surplus waits in the scheduler)."""
        while True:
            room = self.scheduler.num_admittable(self.max_waiting)
            if room == 0:
                await asyncio.sleep(_FULL_WAIT_S)
                continue
            try:
                msgs = await pull.fetch(room, timeout=_PULL_WAIT_S)
            except (TimeoutError, NatsTimeoutError):
                continue
            except Exception as exc:  # JetStream busy (503 while a cluster re-forms), NATS away
                self._log.warning("pulling requests failed, retrying", error=repr(exc))
                await asyncio.sleep(_PULL_RETRY_S)
                continue
            await self._admit_all(msgs)

    async def _admit_all(self, msgs: list[Msg]) -> None:
        for msg in msgs:
            try:
                await self._admit(msg)
            except Exception:
                self._log.exception("request refused: unreadable", subject=msg.subject)
                with contextlib.suppress(Exception):
                    await msg.term()
        self._wake.set()

    async def _drain_loop(self) -> None:
        """Serve requests routed to pipelines no longer active, while `drains_routes` says this stage
        0 is the one to (the lowest active pipeline): none is left waiting on a route nobody pulls."""
        bound: dict[int, JetStreamContext.PullSubscription] = {}
        while True:
            await asyncio.sleep(_DRAIN_EVERY_S)
            if not self.drains_routes:
                continue
            try:
                infos = await self.js.consumers_info(names.REQUESTS_STREAM)
            except Exception:
                continue
            for info in infos:
                route = names.route_of_consumer(self.plan.model, info.name)
                waiting = (info.num_pending or 0) + (info.num_ack_pending or 0)
                if route is None or route in self.active_routes or waiting == 0:
                    continue
                if route not in bound:
                    with contextlib.suppress(Exception):
                        bound[route] = await self.js.pull_subscribe_bind(info.name, names.REQUESTS_STREAM)
                if route in bound:
                    await self._drain(route, bound[route])

    async def _drain(self, route: int, pull: JetStreamContext.PullSubscription) -> None:
        room = self.scheduler.num_admittable(self.max_waiting)
        if room == 0:
            return
        try:
            msgs = await pull.fetch(room, timeout=_DRAIN_PULL_WAIT_S)
        except (TimeoutError, NatsTimeoutError):
            return
        except Exception as exc:
            self._log.warning("an orphaned route could not be drained", route=route, error=repr(exc))
            return
        self._log.info("requests of an inactive pipeline's route taken", route=route, requests=len(msgs))
        await self._admit_all(msgs)

    async def _admit(self, msg: Msg) -> None:
        try:
            request = open_request(msg.data, msg.headers, self.security, self.plan.model)
        except AuthenticationError as exc:
            self.security.reject(exc, subject=msg.subject, what="request")
            if exc.reason == "untrusted" and msg.metadata.num_delivered < UNOPENED_REDELIVERIES:
                await msg.nak(delay=UNOPENED_RETRY_S)  # its key may reach this node in a moment
            else:
                await msg.term()
            return
        request_id = request.request_id
        if self.core.request(request_id) is not None:
            return  # redelivered while we still run it
        try:  # a re-publication the stream's dedupe no longer catches, or nobody waits for it
            check_fresh(request, stored_at=msg.metadata.timestamp.timestamp(), now=time.time())
        except AuthenticationError as exc:
            self.security.reject(exc, request_id=request_id, what="request")
            await msg.term()
            return
        box = event_box(request_id, request.token_key)
        try:
            params = sampling_from_proto(request.sampling)
            qos = qos_from_proto(request)
            prompt = self.core.check_prompt(request_id, request.prompt_token_ids)
        except InvalidRequestError as exc:
            await publish_error(self.nc, request_id, str(exc), 400, box)
            await msg.term()
            return
        emitted: list[int] = []
        if msg.metadata.num_delivered > 1:
            emitted, ended = await read_emitted(self.js, request_id, box)
            if ended:
                await msg.ack()
                return
            self._log.info("request resumed", request_id=request_id, emitted=len(emitted))
        self.core.add_request(request_id, prompt, params, emitted, qos=qos)
        self._deliveries[request_id] = _Delivery(
            msg, request.token_key, box, request.gateway, request.deadline, request.traceparent
        )
        if self.traces.enabled:
            queued_ms = max(0.0, time.time() - request.created) * 1000 if request.created else 0.0
            self.traces.begin(
                request_id,
                request.traceparent,
                request_id,
                attributes={
                    "mohawk.queued_ms": round(queued_ms, 3),
                    "mohawk.tenant": request.tenant,
                    "mohawk.prompt_tokens": len(prompt),
                    "mohawk.resumed_from_token": len(emitted),
                    "mohawk.delivery": msg.metadata.num_delivered,
                },
            )

    # -- stepping ------------------------------------------------------------------------------

    async def _step_loop(self) -> None:
        while True:
            self._wake.clear()
            while len(self._inflight_steps) < self.max_inflight:
                batch = self.core.next_batch(self.num_stages)
                if batch is None:
                    break
                try:
                    await self._run_step(batch)
                except Exception:
                    self._log.exception("step failed", step_id=batch.step_id)
                    self.num_failed_steps += 1
                    await self._fail(batch, "internal error while running the model")
            with contextlib.suppress(TimeoutError):  # not wait_for: 3.11 may swallow a cancel
                async with asyncio.timeout(_IDLE_WAIT_S):
                    await self._wake.wait()

    async def _run_step(self, batch: StepBatch) -> None:
        self.num_steps += 1
        self.stats.record(sum(s.num_new_tokens for s in batch.sequences), len(batch.sequences))
        loop = asyncio.get_running_loop()
        joining = self._joining(batch)
        started, started_at = time.monotonic(), time.time()
        if self.tokens is not None:  # a one-stage pipeline: this node samples too
            results = await self.tokens.sample_step(
                batch,
                joining,
                lambda: loop.run_in_executor(self.executor, self.stage.step, batch, None),
                started_at,
            )
            self.core.record_step(batch, time.monotonic() - started)
            self.stats.emitted += len(results)
            self._traced_step(batch, None, started)
            for result in results:
                self._apply(result)
            return
        dtype, shape, data = await loop.run_in_executor(self.executor, self._forward, batch)
        self._traced_step(batch, None, started)
        step = step_batch_to_proto(batch, joining, with_token_ids=False)
        step.started_at = started_at
        self._inflight_steps[batch.step_id] = _InflightStep(batch, started)
        self.deadlines.sent(batch.step_id, sum(s.num_new_tokens for s in batch.sequences), time.monotonic())
        try:
            await self.link.send_activations(step, dtype, shape, data)
        except Exception as exc:
            # lost in transit, not failed by the model: the next stage cannot be reached or
            # trusted (revoked, its handshake refused, NATS away). The step stays in flight and
            # its sequences resume at its deadline, by then usually on a new plan's pipeline
            self._log.warning(
                "step not sent: it resumes at its deadline", step_id=batch.step_id, error=repr(exc)
            )

    def _forward(self, batch: StepBatch) -> tuple[str, list[int], bytes]:
        output = self.stage.step(batch, None)
        if output.hidden_states is None:
            return "", [], b""
        return self.stage.backend.encode_hidden(output.hidden_states)

    def _joining(self, batch: StepBatch) -> dict[int, Joining]:
        """What the sampling stage needs of each sequence that (re)joins in `batch`."""
        joining: dict[int, Joining] = {}
        for s in batch.sequences:
            seq = self.core.sequence(s.seq_id)
            if s.new_sequence is None or seq is None:
                continue
            delivery = self._deliveries.get(seq.request_id)
            token_key = delivery.token_key if delivery is not None else b""
            traceparent = self.traces.traceparent(seq.request_id)
            joining[s.seq_id] = Joining(seq.request_id, self.core.prompt_tail(seq), token_key, traceparent)
            if traceparent:
                self.traces.event(seq.request_id, "first step", {"mohawk.step_id": batch.step_id})
        return joining

    def _traced_step(self, batch: StepBatch, result_hop_ms: float | None, started: float | None) -> None:
        """Add a step's time here (`started`: when it began) or its result's hop to the spans of
        the requests it carried."""
        if not self.traces.enabled or not len(self.traces):
            return
        step_ms = (time.monotonic() - started) * 1000 if started is not None else None
        keys = [seq.request_id for s in batch.sequences if (seq := self.core.sequence(s.seq_id)) is not None]
        self.traces.stepped(keys, result_hop_ms, step_ms)

    async def _on_result(self, msg: Msg) -> None:
        frame = self.link.receive(msg.data)
        if frame is None or frame[0].kind != KIND_RESULT:
            return
        result = read_result_payload(frame[1])
        if result.plan_version != self.plan.version:
            return
        hop_s = self.hops.record(frame[0].sent_at)
        inflight = self._inflight_steps.pop(result.step_id, None)
        now = time.monotonic()
        if inflight is None or not self.deadlines.returned(result.step_id, now):
            self._log.info("late result of an expired step ignored", step_id=result.step_id)
            return
        if result.error:
            self._log.error("a stage failed a step", step_id=result.step_id, reason=result.error)
            await self._fail(inflight.batch, "internal error while running the model")
            return
        self.core.record_step(inflight.batch, now - inflight.started)
        self._traced_step(inflight.batch, hop_s * 1000 if hop_s is not None else None, None)
        for sampled in result.results:
            self._apply(sampled)
        self._wake.set()

    def _apply(self, sampled: bus_pb2.SampledResult) -> None:
        seq = self.core.sequence(sampled.seq_id)
        if seq is None:
            return  # cancelled while its step was in flight
        delivery = self._deliveries.get(seq.request_id)
        self.resumes.progressed(seq.request_id)
        self.core.apply_token(sampled.seq_id, sampled.token_id, finished=bool(sampled.finish_reason))
        if sampled.finish_reason and delivery is not None:
            ack = asyncio.create_task(delivery.msg.ack())
            self._pending_acks.add(ack)
            ack.add_done_callback(self._pending_acks.discard)

    def _forget(self, seq: Seq) -> None:
        """The core let `seq` go (finished, cancelled or failed): drop what the bus side kept of it."""
        if self.tokens is not None:
            self.tokens.drop(seq.seq_id)
        self.traces.end(seq.request_id, {"mohawk.output_tokens": seq.num_output_tokens})
        self._deliveries.pop(seq.request_id, None)
        self.resumes.progressed(seq.request_id)

    async def _fail(self, batch: StepBatch, reason: str) -> None:
        for step in batch.sequences:
            seq = self.core.sequence(step.seq_id)
            if seq is None:
                continue
            delivery = self._deliveries.get(seq.request_id)
            self.core.finish(seq)
            if delivery is not None:
                await publish_error(self.nc, seq.request_id, reason, 500, delivery.box)
                await delivery.msg.term()
        self._wake.set()

    # -- cancellation and liveness ---------------------------------------------------------------

    async def _on_cancel(self, msg: Msg) -> None:
        request_id = msg.subject.rsplit(".", 1)[-1]
        delivery = self._deliveries.get(request_id)
        if delivery is None:
            return
        if delivery.token_key and not hmac.compare_digest(
            msg.data, cancel_tag(delivery.token_key, request_id)
        ):
            self.security.reject(AuthenticationError("tampered", "cancel without the request's tag"))
            return
        self.core.abort_request(request_id)
        self._log.info("request cancelled", request_id=request_id)
        await delivery.msg.ack()
        self._wake.set()

    async def _keep_alive_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ack_wait_s / _KEEP_ALIVES_PER_ACK_WAIT)
            for delivery in list(self._deliveries.values()):
                with contextlib.suppress(Exception):
                    await delivery.msg.in_progress()

    # -- step deadlines ----------------------------------------------------------------------------

    async def _deadline_loop(self) -> None:
        """Resume the sequences of overdue steps. Every overdue step leaves `_inflight_steps` at
        once, before any resume awaits the bus: a late result that arrives meanwhile then finds
        nothing to take (it is ignored) instead of taking a step whose sequences were not resumed
        yet. The sequences resume concurrently, so a bus that is away (each read of the token
        stream waits out its timeout) delays them all by one timeout, not one each."""
        while True:
            await asyncio.sleep(_DEADLINE_TICK_S)
            seqs: dict[int, Seq] = {}
            for step_id in self.deadlines.overdue(time.monotonic()):
                inflight = self._inflight_steps.pop(step_id, None)
                if inflight is None:
                    continue
                batch = inflight.batch
                self._log.warning(
                    "step overdue: its sequences resume", step_id=step_id, sequences=len(batch.sequences)
                )
                for step in batch.sequences:
                    seq = self.core.sequence(step.seq_id)
                    if seq is not None:
                        seqs[seq.seq_id] = seq
            if not seqs:
                continue
            outcomes = await asyncio.gather(
                *(self._resume(seq) for seq in seqs.values()), return_exceptions=True
            )
            for seq, outcome in zip(seqs.values(), outcomes, strict=True):
                if isinstance(outcome, Exception):
                    self._log.error(
                        "could not resume a request", request_id=seq.request_id, error=repr(outcome)
                    )
            self._wake.set()

    async def _resume(self, seq: Seq) -> None:
        """Free `seq` everywhere and queue its request again from the tokens the token stream holds
        (what the gateway has shown, or will), or end it with an error after `max_resumes`."""
        request_id = seq.request_id
        delivery = self._deliveries.get(request_id)
        if delivery is None:
            self.core.finish(seq)
            return
        expiries = self.resumes.expired(request_id)
        if expiries is None:
            max_resumes = self.resumes.max_resumes
            self._log.error("request made no progress: failed", request_id=request_id, expiries=max_resumes)
            self.core.finish(seq)
            reason = f"the pipeline gave no result for {max_resumes} steps in a row; retry the request"
            with contextlib.suppress(Exception):
                await publish_error(self.nc, request_id, reason, 503, delivery.box)
                await delivery.msg.term()
            return
        try:
            emitted, ended = await read_emitted(self.js, request_id, delivery.box)
        except Exception as exc:  # the bus is away: resume from what this node applied
            self._log.warning("token stream unreadable: resuming from the applied tokens", error=repr(exc))
            emitted, ended = list(seq.output_token_ids), False
        if self.core.sequence(seq.seq_id) is not seq:
            return  # cancelled or ended while the stream was read
        self.core.finish(seq)  # frees its KV blocks here and, with the next step, on every stage
        if ended:
            with contextlib.suppress(Exception):
                await delivery.msg.ack()
            return
        self.core.add_request(
            request_id, seq.token_ids[: seq.num_prompt_tokens], seq.params, emitted, qos=seq.qos
        )
        self._deliveries[request_id] = delivery
        self.resumes.resumed(request_id, expiries)
        resumed = {"mohawk.resumed_from_token": len(emitted)}
        self.traces.begin(request_id, delivery.traceparent, request_id, attributes=resumed)
        self._log.info("request resumed after an overdue step", request_id=request_id, emitted=len(emitted))

    # -- orphans -----------------------------------------------------------------------------------

    async def _orphan_loop(self) -> None:
        """Drop requests nobody waits for: their gateway's presence lapsed, or their deadline passed."""
        while True:
            await asyncio.sleep(ORPHAN_CHECK_S)
            gateways = {d.gateway for d in self._deliveries.values() if d.gateway}
            gone = await self._gateways.gone(gateways, time.monotonic())
            now = time.time()
            for request_id, delivery in list(self._deliveries.items()):
                late = delivery.deadline > 0 and now > delivery.deadline + ORPHAN_CHECK_S
                if delivery.gateway not in gone and not late:
                    continue
                self.core.abort_request(request_id)
                reason = "its gateway is gone" if delivery.gateway in gone else "its deadline passed"
                self._log.warning("orphaned request cancelled", request_id=request_id, reason=reason)
                with contextlib.suppress(Exception):
                    if late:
                        await publish_error(
                            self.nc, request_id, "the request's deadline passed", 504, delivery.box
                        )
                    await delivery.msg.ack()
                self._wake.set()
