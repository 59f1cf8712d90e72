"""Stage 0 of a pipeline on the bus: takes requests off the durable stream and keeps steps flowing
through the stages.

Design. Stage 0 owns the scheduler, through the same `EngineCore` the in-process engine drives
(request table, validation, step batches, token application). A request's life here, from admission
to its ack (results, a failed step, a cancel, an expiry and its resume, orphans, the hand-back), is
one module, `request_table.py`: plain decisions that return the bus actions to carry out
(`bus_actions.py`). Beside it are the steps in flight and their deadlines (`inflight.py`) and which
routes it pulls (`intake_rules.py`). This module is the adapter that moves the bytes: intake
(`intake.py`), frames to and from the stages, cancel messages, keep-alives (`upkeep.py`), and the
step loop. Each step the scheduler picks runs through stage 0's layers (`StageCompute`, the step
every role shares) and its hidden states go to stage 1 as activation frames; the last stage samples,
publishes the token events and sends back `StepResult`s, which append the tokens (or end the
sequences) here. A request leaves the stream (ack) only when it has finished; while it runs, stage 0
keeps extending its ack deadline; when the plan changes, every unfinished request is handed back
(nak) and the new stage 0 replays its emitted tokens from the token stream and continues at the next
index. A cancel frees the sequence's KV blocks at once. A step whose result has not come by its
deadline is given up: its sequences are freed and resumed from the tokens the token stream holds for
them, as after a plan change, and a result that still comes late is ignored. A request whose steps
expire `max_resumes` times in a row without a token in between ends with an error event (503), so no
request waits for its client's timeout: the bound is about `max_resumes × (floor + the expected
round trip × factor)`, 15–20 s with the defaults. A request whose gateway is gone, or whose deadline
passed, is cancelled and leaves the stream. Every step's time from its start to its result feeds the
core's latency-budget cap. With tracing on, the first frame of a sequence names its request's span
here, so stage 1's span is its child.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Set
from concurrent.futures import Executor
from typing import Any

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from mohawk_common.bus import names
from mohawk_common.bus.frames import KIND_RESULT, read_result_payload
from mohawk_common.bus.security import Security
from mohawk_common.tasks import cancel_and_wait
from mohawk_pqc.errors import AuthenticationError
from mohawk_shard.engine.scheduler import Scheduler
from mohawk_shard.engine.stage import Stage, StepBatch
from mohawk_shard.node.bus_actions import BusActions
from mohawk_shard.node.compute import StageCompute
from mohawk_shard.node.hops import HopStats
from mohawk_shard.node.inflight import StepsInFlight
from mohawk_shard.node.intake import RequestIntake
from mohawk_shard.node.intake_rules import Routes
from mohawk_shard.node.link import StageLink
from mohawk_shard.node.pipeline_view import PipelineView
from mohawk_shard.node.request_table import RequestTable
from mohawk_shard.node.snapshot import MAX_HELD_ACKS, QueueSnapshot, StageSnapshot, StepStats, stage_snapshot
from mohawk_shard.node.tokens import TokenPublisher
from mohawk_shard.node.traces import StageTraces
from mohawk_shard.node.upkeep import Upkeep
from mohawk_shard.node.wire import step_batch_to_proto, write_mirror

log = structlog.get_logger("mohawk.shard.head")

_IDLE_WAIT_S = 0.5
# a failover's catch-up step waits this long for the rest of the requests handed back: they come
# in several pulls (the route's consumer and the shared one, a burst each), admitted a few ms
# apart, and a catch-up in two steps costs a step more (the 1.7B's 16 streams: 218 and 314 ms)
_CATCH_UP_GATHER_S = 0.02


class HeadDriver:
    def __init__(
        self,
        *,
        nc: Client,
        js: JetStreamContext,
        link: StageLink,
        security: Security,
        view: PipelineView,
        stage: Stage,
        scheduler: Scheduler,
        executor: Executor,
        vocab_size: int,
        tokens: TokenPublisher | None,
        max_inflight_steps: int | None,
        ack_wait_s: float,
        step_deadline_floor_s: float,
        max_resumes: int,
        max_waiting: int,
        traces: StageTraces | None = None,
        on_hold: Callable[[], None] | None = None,
    ) -> None:
        self.nc, self.js, self.view = nc, js, view
        self.stage_index = 0  # every role has one (the node, its metrics and reports read it)
        self.link, self.security = link, security
        self.scheduler = scheduler
        self.tokens = tokens  # set when this node is also the last stage
        self._log = log.bind(epoch=view.epoch, pipeline=view.pipeline)
        self.bus = BusActions(nc, self._log)
        self.num_stages = view.num_stages
        self.ack_wait_s = ack_wait_s
        self.num_steps = 0  # steps started here (the node's idle detection watches it)
        self.stats = StepStats()  # for the telemetry service
        self.compute = StageCompute(stage, executor, tokens, self.stats)
        self.traces = traces if traces is not None else StageTraces.off()
        drop_events = (lambda seq: tokens.drop(seq.seq_id)) if tokens is not None else None
        self.table = RequestTable(
            scheduler,
            vocab_size,
            max_resumes,
            self.traces,
            on_forget=drop_events,
            on_hold=on_hold,
            carried=self._num_carried,
        )
        self.core, self.held = self.table.core, self.table.held
        self.inflight = StepsInFlight(max_inflight_steps or self.num_stages, step_deadline_floor_s)
        self.routes = Routes(view.pipeline)  # the node keeps it current as the plan changes
        self._wake = asyncio.Event()
        self.intake = RequestIntake(
            nc=nc,
            js=js,
            security=security,
            served_model=view.model,
            table=self.table,
            bus=self.bus,
            routes=self.routes,
            max_waiting=max_waiting,
            ack_wait_s=ack_wait_s,
            wake=self._wake.set,
            log=self._log,
        )
        self.upkeep = Upkeep(
            js=js,
            security=security,
            table=self.table,
            bus=self.bus,
            inflight=self.inflight,
            ack_wait_s=ack_wait_s,
            wake=self._wake.set,
            log=self._log,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.hops = HopStats()
        self.num_failed_steps = 0  # steps stage 0 itself could not run (heartbeats report them)
        self._subs: list[Any] = []

    waits_for_active = True  # it pulls requests only once every stage of its pipeline is loaded

    @property
    def num_expired_steps(self) -> int:
        """Steps given up waiting for (their deadline passed), since this role started."""
        return self.inflight.num_expired

    def follow_pipelines(self, active: Set[int], *, drains: bool) -> None:
        """The plan's active pipelines now, and whether this stage 0 drains the others' routes."""
        self.routes.follow(active, drains=drains)

    def stage_snapshot(self) -> StageSnapshot:
        """Stage 0's part of the node's snapshot, its queue included."""
        queue = QueueSnapshot(
            len(self.scheduler.waiting),
            len(self.scheduler.running),
            self.kv_blocks_used,
            tuple(self.held.ack_subjects(MAX_HELD_ACKS)),
            self.table.resumes,
        )
        return stage_snapshot(self.view, self.stage_index, self.stats, self.hops, queue)

    @property
    def kv_blocks_used(self) -> int:
        """KV blocks handed out to running sequences (every stage of the pipeline holds the same)."""
        return self.view.num_kv_blocks - self.scheduler.block_manager.num_free_blocks

    async def start(self) -> None:
        await self.link.start()
        if self.num_stages > 1:
            try:
                await self.link.connect_neighbours()
            except Exception as exc:  # a peer still starting: the first step handshakes again
                self._log.warning("neighbours not reached yet", error=repr(exc))
        await self.intake.subscribe()
        self._subs.append(await self.nc.subscribe(names.CANCEL_WILDCARD, cb=self._on_cancel))
        if self.tokens is None:
            stage_0 = self.view.stages[0].node_id
            subject = names.activation_subject(stage_0, self.view.epoch, self.view.pipeline, 0)
            self._subs.append(await self.nc.subscribe(subject, cb=self._on_result))
        self._tasks = [
            *self.intake.loops(),
            asyncio.create_task(self._step_loop()),
            *self.upkeep.loops(),
        ]
        self._log.info("stage 0 serving", model=self.view.model, stages=self.num_stages)

    async def stop(self) -> None:
        """Stop stepping and hand every unfinished request back to the stream for the next stage 0."""
        try:
            await cancel_and_wait(*self._tasks)
        except Exception as exc:  # a loop that had died already: stopping (and the switch) go on
            self._log.error("a stage 0 loop had failed", error=repr(exc))
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await self.intake.unsubscribe()
        handed_back = self.table.hand_back()
        await self.bus.carry_out(handed_back)
        await self.link.stop()
        self.traces.end_all()
        self._log.info("stage 0 stopped", handed_back=len(handed_back))
        # the ended tasks' frames and the subscriptions' callbacks hold this driver: let go of them
        # and of the stage, so its weights and KV pool go when the node lets go of them (CI saw a
        # re-planned stage 0 keep its old 1 GiB pool beside the new one, never collected)
        self._tasks, self._subs = [], []
        self.compute.release()

    # -- stepping ------------------------------------------------------------------------------

    async def _step_loop(self) -> None:
        while True:
            self._wake.clear()
            while self.inflight.has_room():
                if self.core.is_catching_up:
                    await asyncio.sleep(_CATCH_UP_GATHER_S)
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
        self.compute.record(batch)
        joining = self.table.joining(batch)
        started, started_at = time.monotonic(), time.time()
        if self.tokens is not None:  # a one-stage pipeline: this node samples too
            sampled = await self.compute.sample(batch, joining, None, started_at)
            self.core.record_step(batch, time.monotonic() - started)
            self._traced_step(batch, None, started)
            self.bus.start(self.table.apply(sampled.results))
            await self.tokens.publish(sampled)
            return
        (dtype, shape, data), mirrored = await self.compute.forward(batch, None)
        self._traced_step(batch, None, started)
        step = step_batch_to_proto(batch, joining, with_token_ids=False)
        step.started_at = started_at
        if mirrored is not None:
            write_mirror(step.mirror, mirrored)
        self.inflight.sent(batch, started, time.monotonic())
        try:
            await self.link.send_activations(step, dtype, shape, data)
        except Exception as exc:
            # lost in transit, not failed by the model: the next stage cannot be reached or
            # trusted (revoked, its handshake refused, NATS away). The step stays in flight and
            # its sequences resume at its deadline, by then usually on a new plan's pipeline
            self._log.warning(
                "step not sent: it resumes at its deadline", step_id=batch.step_id, error=repr(exc)
            )

    def _num_carried(self, request_id: str, history_len: int) -> int:
        stage = self.compute.stage
        return stage.num_carried(request_id, history_len) if stage is not None else 0

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
        if result.plan_version != self.view.epoch:  # a result of another epoch's pipeline
            return
        hop_s = self.hops.record(frame[0].sent_at)
        now = time.monotonic()
        inflight = self.inflight.returned(result.step_id, now)
        if inflight is None:
            self._log.info("late result of an expired step ignored", step_id=result.step_id)
            return
        if result.error:
            self._log.error("a stage failed a step", step_id=result.step_id, reason=result.error)
            await self._fail(inflight.batch, "internal error while running the model")
            return
        self.core.record_step(inflight.batch, now - inflight.started)
        self._traced_step(inflight.batch, hop_s * 1000 if hop_s is not None else None, None)
        self.bus.start(self.table.apply(result.results))
        self._wake.set()

    async def _fail(self, batch: StepBatch, reason: str) -> None:
        await self.bus.carry_out(self.table.fail(batch, reason))
        self._wake.set()

    # -- cancellation ----------------------------------------------------------------------------

    async def _on_cancel(self, msg: Msg) -> None:
        request_id = msg.subject.rsplit(".", 1)[-1]
        actions = self.table.cancel(request_id, msg.data)
        if actions is None:
            self.security.reject(AuthenticationError("tampered", "cancel without the request's tag"))
            return
        if actions:
            self._log.info("request cancelled", request_id=request_id)
            await self.bus.carry_out(actions)
            self._wake.set()
