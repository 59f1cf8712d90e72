"""Stages 1..N-1: activation frames in, the stage's layers, frames on to the next stage or tokens out.

Frames of one plan arrive on `mohawk.v1.act.<plan>.<stage>` in step order (core NATS keeps one
publisher's order) and are processed one at a time, in that order, so every stage sees a
sequence's steps in the order stage 0 scheduled them. The model runs on the node's compute thread,
so the event loop keeps receiving the next step's frames meanwhile. The last stage samples,
publishes token events and answers stage 0 with a `StepResult` for every step, even an empty one,
so stage 0 can count its steps in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import Executor
from typing import Any

import structlog
import torch
from nats.aio.client import Client
from nats.aio.msg import Msg

from mohawk_common.bus import names
from mohawk_common.bus.frames import FrameAssembler, FrameError, encode_frames
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.hops import HopStats
from mohawk_shard.node.tokens import TokenPublisher
from mohawk_shard.node.wire import step_batch_from_proto, tensor_from_bytes, tensor_to_bytes
from mohawk_shard.stage import Stage, StepBatch

log = structlog.get_logger("mohawk.shard.worker")


class StageWorker:
    def __init__(
        self,
        *,
        nc: Client,
        plan: bus_pb2.Plan,
        stage_index: int,
        stage: Stage,
        executor: Executor,
        device: torch.device,
        tokens: TokenPublisher | None,
    ) -> None:
        self.nc, self.plan, self.stage_index = nc, plan, stage_index
        self.stage, self.executor, self.device = stage, executor, device
        self.tokens = tokens  # set on the last stage
        self._inbox: asyncio.Queue[tuple[Msg, float]] = asyncio.Queue()
        self._assembler = FrameAssembler()
        self.hops = HopStats()
        self._task: asyncio.Task[None] | None = None
        self._sub: Any = None
        self._log = log.bind(plan=plan.version, stage=stage_index)

    async def start(self) -> None:
        subject = names.activation_subject(self.plan.version, self.stage_index)
        self._sub = await self.nc.subscribe(subject, cb=self._on_message, pending_bytes_limit=1 << 30)
        self._task = asyncio.create_task(self._run())
        self._log.info("stage serving", subject=subject, last=self.tokens is not None)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _on_message(self, msg: Msg) -> None:
        # stamp arrival here: time queued behind this stage's own steps is not part of the hop
        self._inbox.put_nowait((msg, time.time()))

    async def _run(self) -> None:
        while True:
            msg, arrived_at = await self._inbox.get()
            try:
                frame = self._assembler.add(msg.data)
            except FrameError as exc:
                self._log.warning("bad activation frame dropped", reason=str(exc))
                continue
            if frame is not None:
                self.hops.record(frame[0].sent_at, arrived_at)
                try:
                    await self._handle(*frame)
                except Exception:
                    self._log.exception("step failed", step_id=frame[0].step.step_id)

    async def _handle(self, header: bus_pb2.ActivationHeader, data: bytes) -> None:
        if header.plan_version != self.plan.version:
            return
        batch, joining = step_batch_from_proto(header.step)
        hidden = None
        if data:
            hidden = tensor_from_bytes(header.dtype, header.shape, data, self.device)
        loop = asyncio.get_running_loop()
        if self.tokens is not None:
            self.tokens.follow(batch, joining)
            output = await loop.run_in_executor(self.executor, self.stage.step, batch, hidden)
            result = bus_pb2.StepResult(plan_version=self.plan.version, step_id=batch.step_id)
            result.results.extend(await self.tokens.publish(output.sampled))
            result.sent_at = time.time()
            await self.nc.publish(names.activation_subject(self.plan.version, 0), result.SerializeToString())
            return
        dtype, shape, out = await loop.run_in_executor(self.executor, self._forward, batch, hidden)
        header.stage = self.stage_index + 1
        header.dtype = dtype
        del header.shape[:]
        header.shape.extend(shape)
        header.sent_at = time.time()
        subject = names.activation_subject(self.plan.version, self.stage_index + 1)
        for frame in encode_frames(header, out, self.nc.max_payload):
            await self.nc.publish(subject, frame)

    def _forward(self, batch: StepBatch, hidden: torch.Tensor | None) -> tuple[str, list[int], bytes]:
        output = self.stage.step(batch, hidden)
        if output.hidden_states is None:
            return "", [], b""
        return tensor_to_bytes(output.hidden_states)
