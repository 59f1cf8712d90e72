"""Stages 1..N-1: activation frames in, the stage's layers, frames on to the next stage or tokens out.

Frames of one pipeline arrive on `mohawk.v1.act.<node>.<epoch>.<pipeline>.<stage>` in step order
(core NATS keeps one publisher's order), are opened on the channel with the previous stage
(`StageLink`), and are processed one at a time, in that order, so every stage sees a sequence's
steps in the order stage 0 scheduled them. The model runs on the node's compute thread,
so the event loop keeps receiving the next step's frames meanwhile. The last stage samples,
publishes token events and answers stage 0 with a `StepResult` for every step, even an empty one,
so stage 0 can count its steps in flight. A step this stage cannot run is not dropped: it goes on
as a failed frame, and the last stage answers stage 0 with an error result, so stage 0 fails those
requests (their clients get an error) instead of waiting for a result that never comes. The
step itself, forward or sample, is `StageCompute`, which stage 0 runs too. With tracing on, each
sequence gets a span here (`StageTraces`), the child of the previous stage's, and the frame passed
on names this stage's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Set
from concurrent.futures import Executor
from typing import Any

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

from mohawk_common.bus import names
from mohawk_common.bus.frames import KIND_FAILED, FrameError, read_activation_payload
from mohawk_common.tasks import cancel_and_wait
from mohawk_proto.v1 import bus_pb2, engine_pb2, security_pb2
from mohawk_shard.engine.stage import Stage, StepBatch
from mohawk_shard.node.compute import StageCompute
from mohawk_shard.node.hops import HopStats
from mohawk_shard.node.link import StageLink
from mohawk_shard.node.pipeline_view import PipelineView
from mohawk_shard.node.snapshot import StageSnapshot, StepStats, stage_snapshot
from mohawk_shard.node.tokens import TokenPublisher
from mohawk_shard.node.traces import StageTraces
from mohawk_shard.node.wire import Joining, step_batch_from_proto, take_mirror, write_mirror

log = structlog.get_logger("mohawk.shard.worker")


class StageWorker:
    def __init__(
        self,
        *,
        nc: Client,
        link: StageLink,
        view: PipelineView,
        stage_index: int,
        stage: Stage,
        executor: Executor,
        tokens: TokenPublisher | None,
        traces: StageTraces | None = None,
    ) -> None:
        self.nc, self.link, self.view, self.stage_index = nc, link, view, stage_index
        self.tokens = tokens  # set on the last stage
        self.traces = traces if traces is not None else StageTraces.off()
        self._inbox: asyncio.Queue[tuple[Msg, float]] = asyncio.Queue()
        self.hops = HopStats()
        self.num_failed_steps = 0  # steps this stage itself could not run (heartbeats report them)
        self.num_steps = 0  # frames of steps handled (the node's idle detection watches it)
        self.stats = StepStats()  # for the telemetry service
        self.compute = StageCompute(stage, executor, tokens, self.stats)
        self._task: asyncio.Task[None] | None = None
        self._sub: Any = None
        self._log = log.bind(epoch=view.epoch, pipeline=view.pipeline, stage=stage_index)

    num_expired_steps = 0  # only stage 0 gives steps up
    waits_for_active = False  # subscribed at once, so no frame of its pipeline is missed

    def follow_pipelines(self, active: Set[int], *, drains: bool) -> None:
        """Only stage 0 pulls requests: which pipelines are active changes nothing here."""

    def stage_snapshot(self) -> StageSnapshot:
        """This stage's part of the node's snapshot."""
        return stage_snapshot(self.view, self.stage_index, self.stats, self.hops)

    async def start(self) -> None:
        await self.link.start()
        node_id = self.view.stages[self.stage_index].node_id
        subject = names.activation_subject(node_id, self.view.epoch, self.view.pipeline, self.stage_index)
        self._sub = await self.nc.subscribe(subject, cb=self._on_message, pending_bytes_limit=1 << 30)
        self._task = asyncio.create_task(self._run())
        self._log.info("stage serving", subject=subject, last=self.tokens is not None)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        await cancel_and_wait(self._task)
        # the subscription calls back into this worker and the ended task's CancelledError holds
        # its frame, which holds this worker: let go of both, so that the stage (its weights and
        # KV pool) is freed as soon as the node lets go of it, not at the next cycle collection
        self._sub = self._task = None
        self.compute.release()
        self.traces.end_all()
        await self.link.stop()

    async def _on_message(self, msg: Msg) -> None:
        # stamp arrival here: time queued behind this stage's own steps is not part of the hop
        self._inbox.put_nowait((msg, time.time()))

    async def _run(self) -> None:
        while True:
            msg, arrived_at = await self._inbox.get()
            frame = self.link.receive(msg.data)
            if frame is None:
                continue
            header, payload = frame
            self.hops.record(header.sent_at, arrived_at)
            self.num_steps += 1
            try:
                step, data = read_activation_payload(payload)
            except FrameError as exc:
                self._log.warning("bad activation frame dropped", reason=str(exc))
                continue
            if header.kind == KIND_FAILED:
                await self._pass_failure(step, "an earlier stage failed this step")
                continue
            try:
                await self._handle(header, step, data, (arrived_at - header.sent_at) * 1000)
            except Exception as exc:
                self._log.exception("step failed", step_id=header.step_id)
                self.num_failed_steps += 1
                await self._pass_failure(step, f"stage {self.stage_index} failed: {type(exc).__name__}")

    async def _pass_failure(self, step: engine_pb2.StepBatch, reason: str) -> None:
        """Tell stage 0 (through the stages after this one) that `step` failed, so it fails its
        sequences instead of waiting for a result that will never come."""
        with contextlib.suppress(Exception):
            if self.tokens is not None:
                result = bus_pb2.StepResult(plan_version=self.view.epoch, step_id=step.step_id, error=reason)
                result.sent_at = time.time()
                await self.link.send_result(result)
            else:
                await self.link.send_activations(step, "", [], b"", failed=True)

    async def _handle(
        self, header: security_pb2.FrameHeader, step: engine_pb2.StepBatch, data: bytes, hop_ms: float
    ) -> None:
        mirror = take_mirror(step)  # the stage before's KV, kept here, not passed on
        batch, joining = step_batch_from_proto(step)
        self.compute.record(batch)
        if self.traces.enabled:
            joining = self._trace(step, joining, batch.freed_seq_ids, hop_ms)
        hidden = (header.dtype, list(header.shape), data) if data else None
        started = time.monotonic()
        if self.tokens is not None:
            sampled = await self.compute.sample(
                batch, joining, hidden, step.started_at or time.time(), mirror
            )
            self._traced_step(batch, hop_ms, started)
            for done in sampled.results:
                if done.finish_reason:
                    self.traces.end(done.seq_id, {"mohawk.finish_reason": done.finish_reason})
            result = bus_pb2.StepResult(plan_version=self.view.epoch, step_id=batch.step_id)
            result.results.extend(sampled.results)
            result.sent_at = time.time()
            await self.link.send_result(result)
            await asyncio.sleep(0)  # the result goes out now (nats-py's flusher), the events after
            await self.tokens.publish(sampled)
            return
        (dtype, shape, out), mirrored = await self.compute.forward(batch, hidden, mirror)
        self._traced_step(batch, hop_ms, started)
        if mirrored is not None:
            write_mirror(step.mirror, mirrored)
        await self.link.send_activations(step, dtype, shape, out)

    def _trace(
        self,
        step: engine_pb2.StepBatch,
        joining: dict[int, Joining],
        freed: tuple[int, ...],
        hop_ms: float,
    ) -> dict[int, Joining]:
        """End the spans of freed sequences; open those of joining ones, and name them in the frame
        that goes on (and in what the sampler learns), so the next hop is their child."""
        for seq_id in freed:
            self.traces.end(seq_id, at_last_step=True)
        for item in step.sequences:
            joined = joining.get(item.seq_id)
            if joined is None:
                continue
            own = self.traces.begin(item.seq_id, joined.traceparent, joined.request_id, hop_ms=hop_ms)
            item.new_sequence.traceparent = own
            joining[item.seq_id] = joined._replace(traceparent=own)
        return joining

    def _traced_step(self, batch: StepBatch, hop_ms: float, started: float) -> None:
        if self.traces.enabled:
            step_ms = (time.monotonic() - started) * 1000
            self.traces.stepped((s.seq_id for s in batch.sequences), hop_ms, step_ms)
