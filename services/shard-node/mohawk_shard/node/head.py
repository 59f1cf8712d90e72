"""Stage 0 of a pipeline: takes requests off the durable stream and keeps steps flowing through the stages.

Design. Stage 0 owns the scheduler. It pulls a request from the work-queue stream only while it has
room (sequence slots and free KV blocks): that is the backpressure, and whatever it does not pull
waits, durable, on the stream. Each step the scheduler picks runs through stage 0's layers and its
hidden states go to stage 1 as activation frames; the last stage samples, publishes the token events
and sends back `StepResult`s, which append the tokens (or end the sequences) here. Up to one step
per stage is in flight: a sequence waiting for its token sits out the next steps by itself, and
each step takes at most its share of the unfinished sequences, so the running set splits into
micro-batches that keep every stage busy. A request leaves the stream (ack) only when it has
finished; while it runs, stage 0 keeps extending its ack deadline; when the plan changes, every
unfinished request is handed back (nak) and the new stage 0 replays its emitted tokens from the
token stream and continues at the next index. A cancel frees the sequence's KV blocks at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import math
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
from mohawk_common.bus.frames import KIND_RESULT, read_result_payload
from mohawk_common.bus.requests import cancel_tag, open_request
from mohawk_common.bus.security import Security
from mohawk_common.errors import InvalidRequestError
from mohawk_common.tasks import cancel_and_wait
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.seal import EventBox
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.engine.llm_engine import to_step_batch
from mohawk_shard.engine.scheduler import Scheduler
from mohawk_shard.engine.sequence import Sequence as Seq
from mohawk_shard.node.hops import HopStats
from mohawk_shard.node.link import StageLink
from mohawk_shard.node.recovery import read_emitted
from mohawk_shard.node.tokens import TokenPublisher, event_box, publish_error
from mohawk_shard.node.wire import Joining, sampling_from_proto, step_batch_to_proto
from mohawk_shard.stage import Stage, StepBatch

log = structlog.get_logger("mohawk.shard.head")

_PROMPT_TAIL = 5
_MAX_WAITING = 8
_IDLE_WAIT_S = 0.5


@dataclass(slots=True)
class _Active:
    msg: Msg
    seq: Seq
    token_key: bytes
    box: EventBox | None


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
    ) -> None:
        self.nc, self.js, self.plan = nc, js, plan
        self.link, self.security = link, security
        self.stage, self.scheduler, self.executor = stage, scheduler, executor
        self.vocab_size = vocab_size
        self.tokens = tokens  # set when this node is also the last stage
        self.num_stages = len(plan.stages)
        self.max_inflight = max_inflight_steps or self.num_stages
        self.ack_wait_s = ack_wait_s
        self._active: dict[str, _Active] = {}
        self._by_seq_id: dict[int, _Active] = {}
        self._seq_ids = itertools.count()
        self._step_ids = itertools.count()
        self._num_inflight = 0
        self._inflight_steps: dict[int, StepBatch] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._pending_acks: set[asyncio.Task[None]] = set()
        self.hops = HopStats()
        self._subs: list[Any] = []
        self._log = log.bind(plan=plan.version)

    @property
    def num_active(self) -> int:
        return len(self._active)

    async def start(self) -> None:
        model = self.plan.model
        await self.link.start()
        if self.num_stages > 1:
            await self.link.connect_neighbours()
        self._pull = await self.js.pull_subscribe(
            names.request_subject(model),
            durable=names.stage0_consumer(model),
            stream=names.REQUESTS_STREAM,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait_s, max_ack_pending=-1
            ),
        )
        self._subs.append(await self.nc.subscribe(names.CANCEL_WILDCARD, cb=self._on_cancel))
        if self.tokens is None:
            subject = names.activation_subject(self.plan.version, 0)
            self._subs.append(await self.nc.subscribe(subject, cb=self._on_result))
        self._tasks = [
            asyncio.create_task(self._pull_loop()),
            asyncio.create_task(self._step_loop()),
            asyncio.create_task(self._keep_alive_loop()),
        ]
        self._log.info("stage 0 serving", model=model, stages=self.num_stages)

    async def stop(self) -> None:
        """Stop stepping and hand every unfinished request back to the stream for the next stage 0."""
        await cancel_and_wait(*self._tasks)
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await self._pull.unsubscribe()
        for active in list(self._active.values()):
            with contextlib.suppress(Exception):
                await active.msg.nak()
        await self.link.stop()
        self._log.info("stage 0 stopped", handed_back=len(self._active))
        self._active.clear()
        self._by_seq_id.clear()

    # -- admission -----------------------------------------------------------------------------

    def _room(self) -> int:
        scheduler = self.scheduler
        slots = scheduler.config.max_num_seqs - scheduler.num_unfinished
        waiting_room = _MAX_WAITING - len(scheduler.waiting)
        if scheduler.block_manager.num_free_blocks <= len(scheduler.running):
            return 0  # no KV room: leave requests on the stream
        return max(0, min(slots, waiting_room))

    async def _pull_loop(self) -> None:
        while True:
            room = self._room()
            if room == 0:
                await asyncio.sleep(0.02)
                continue
            try:
                msgs = await self._pull.fetch(room, timeout=1.0)
            except (TimeoutError, NatsTimeoutError):
                continue
            for msg in msgs:
                try:
                    await self._admit(msg)
                except Exception:
                    self._log.exception("request refused: unreadable", subject=msg.subject)
                    with contextlib.suppress(Exception):
                        await msg.term()
            self._wake.set()

    async def _admit(self, msg: Msg) -> None:
        try:
            request = open_request(msg.data, msg.headers, self.security, self.plan.model)
        except AuthenticationError as exc:
            self.security.reject(exc, subject=msg.subject, what="request")
            await msg.term()
            return
        request_id = request.request_id
        if request_id in self._active:
            return  # redelivered while we still run it
        box = event_box(request_id, request.token_key)
        try:
            params = sampling_from_proto(request.sampling)
            prompt = self._checked_prompt(request)
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
        seq = Seq(next(self._seq_ids), request_id, prompt, params)
        for token_id in emitted:
            seq.append_token(token_id)
        active = _Active(msg, seq, request.token_key, box)
        self._active[request_id] = active
        self._by_seq_id[seq.seq_id] = active
        if self.tokens is not None:
            self.tokens.emitter.track(
                seq.seq_id, request_id, params, len(prompt), prompt[-_PROMPT_TAIL:], emitted
            )
            self.tokens.set_key(seq.seq_id, request_id, request.token_key)
        self.scheduler.add(seq)

    def _checked_prompt(self, request: bus_pb2.GenerateRequest) -> list[int]:
        prompt = list(request.prompt_token_ids)
        if not prompt:
            raise InvalidRequestError("the prompt is empty")
        if len(prompt) >= self.plan.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt)} tokens, but the context holds {self.plan.max_model_len} "
                "(prompt plus at least one generated token)"
            )
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise InvalidRequestError(f"prompt token ids must lie in [0, {self.vocab_size})")
        return prompt

    # -- stepping ------------------------------------------------------------------------------

    async def _step_loop(self) -> None:
        while True:
            self._wake.clear()
            while self._num_inflight < self.max_inflight:
                cap = None
                if self.num_stages > 1:
                    cap = max(1, math.ceil(self.scheduler.num_unfinished / self.num_stages))
                scheduled = self.scheduler.schedule(max_seqs=cap)
                if scheduled.is_empty:
                    break
                batch = to_step_batch(next(self._step_ids), scheduled)
                try:
                    await self._run_step(batch)
                except Exception:
                    self._log.exception("step failed", step_id=batch.step_id)
                    await self._fail(batch, "internal error while running the model")
            with contextlib.suppress(TimeoutError):  # not wait_for: 3.11 may swallow a cancel
                async with asyncio.timeout(_IDLE_WAIT_S):
                    await self._wake.wait()

    async def _run_step(self, batch: StepBatch) -> None:
        loop = asyncio.get_running_loop()
        if self.tokens is not None:
            output = await loop.run_in_executor(self.executor, self.stage.step, batch, None)
            for result in await self.tokens.publish(output.sampled):
                self._apply(result)
            return
        dtype, shape, data = await loop.run_in_executor(self.executor, self._forward, batch)
        specs: dict[int, Joining] = {}
        for s in batch.sequences:
            active = self._by_seq_id.get(s.seq_id)
            if s.new_sequence is not None and active is not None:
                specs[s.seq_id] = (active.seq.request_id, self._prompt_tail(s.seq_id), active.token_key)
        step = step_batch_to_proto(batch, specs, with_token_ids=False)
        await self.link.send_activations(step, dtype, shape, data)
        self._inflight_steps[batch.step_id] = batch
        self._num_inflight += 1

    def _forward(self, batch: StepBatch) -> tuple[str, list[int], bytes]:
        output = self.stage.step(batch, None)
        if output.hidden_states is None:
            return "", [], b""
        return self.stage.backend.encode_hidden(output.hidden_states)

    def _prompt_tail(self, seq_id: int) -> list[int]:
        seq = self._by_seq_id[seq_id].seq
        return seq.token_ids[: seq.num_prompt_tokens][-_PROMPT_TAIL:]

    async def _on_result(self, msg: Msg) -> None:
        frame = self.link.receive(msg.data)
        if frame is None or frame[0].kind != KIND_RESULT:
            return
        result = read_result_payload(frame[1])
        if result.plan_version != self.plan.version:
            return
        self.hops.record(frame[0].sent_at)
        self._num_inflight = max(0, self._num_inflight - 1)
        batch = self._inflight_steps.pop(result.step_id, None)
        if result.error:
            self._log.error("a stage failed a step", step_id=result.step_id, reason=result.error)
            if batch is not None:
                await self._fail(batch, "internal error while running the model")
            return
        for sampled in result.results:
            self._apply(sampled)
        self._wake.set()

    def _apply(self, sampled: bus_pb2.SampledResult) -> None:
        active = self._by_seq_id.get(sampled.seq_id)
        if active is None or active.seq.is_finished:
            return  # cancelled while its step was in flight
        active.seq.append_token(sampled.token_id)
        if sampled.finish_reason:
            self._finish(active)
            ack = asyncio.create_task(active.msg.ack())
            self._pending_acks.add(ack)
            ack.add_done_callback(self._pending_acks.discard)

    def _finish(self, active: _Active) -> None:
        self.scheduler.finish(active.seq)
        if self.tokens is not None:
            self.tokens.drop(active.seq.seq_id)
        self._active.pop(active.seq.request_id, None)
        self._by_seq_id.pop(active.seq.seq_id, None)

    async def _fail(self, batch: StepBatch, reason: str) -> None:
        for step in batch.sequences:
            active = self._by_seq_id.get(step.seq_id)
            if active is None:
                continue
            self._finish(active)
            await publish_error(self.nc, active.seq.request_id, reason, 500, active.box)
            await active.msg.term()
        self._wake.set()

    # -- cancellation and liveness ---------------------------------------------------------------

    async def _on_cancel(self, msg: Msg) -> None:
        request_id = msg.subject.rsplit(".", 1)[-1]
        active = self._active.get(request_id)
        if active is None:
            return
        if active.token_key and not hmac.compare_digest(msg.data, cancel_tag(active.token_key, request_id)):
            self.security.reject(AuthenticationError("tampered", "cancel without the request's tag"))
            return
        self._finish(active)
        self._log.info("request cancelled", request_id=request_id)
        await active.msg.ack()
        self._wake.set()

    async def _keep_alive_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ack_wait_s / 3)
            for active in list(self._active.values()):
                with contextlib.suppress(Exception):
                    await active.msg.in_progress()
