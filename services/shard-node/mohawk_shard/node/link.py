"""`StageLink`: how one stage of one pipeline talks to its neighbours — channels, sealed frames, opening them.

Stage 0 sends activations to stage 1 and receives step results from the last stage; stage i sends
activations to stage i+1; the last stage sends step results to stage 0. On a secure node every
frame goes over the channel with that neighbour (handshaken on first use, see
`mohawk_common.bus.channels`) and every incoming frame must open on one of this pipeline's
channels (of its epoch), from the stage that sends its kind (`mohawk_common.bus.positions`:
activations only from the stage before, step results only from the last stage into stage 0); on an
insecure node frames travel in plaintext. Rejected frames are counted by reason and dropped.
"""

from __future__ import annotations

import time

from nats.aio.client import Client

from mohawk_common.bus import names
from mohawk_common.bus.channels import ChannelManager, SecureChannel
from mohawk_common.bus.frames import (
    KIND_ACTIVATIONS,
    KIND_FAILED,
    KIND_RESULT,
    FrameAssembler,
    FrameError,
    FrameOpener,
    activation_payload,
    encode_frames,
)
from mohawk_common.bus.security import Security
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2, engine_pb2, security_pb2
from mohawk_shard.node.pipeline_view import PipelineView


class StageLink:
    def __init__(
        self, nc: Client, security: Security, *, node_id: str, view: PipelineView, stage: int
    ) -> None:
        self.nc, self.security, self.view, self.stage = nc, security, view, stage
        self.epoch, self.pipeline = view.epoch, view.pipeline
        peers = {s.node_id: i for i, s in enumerate(view.stages)}
        self.channels = ChannelManager(
            nc, security, node_id=node_id, plan_version=view.epoch, expected_peers=peers, model=view.model
        )
        self._opener = FrameOpener(security, self.channels)
        self._assembler = FrameAssembler()

    async def start(self) -> None:
        await self.channels.start()

    async def stop(self) -> None:
        await self.channels.stop()

    async def _channel(self, stage: int) -> SecureChannel | None:
        if not self.security.secure:
            return None
        return await self.channels.channel_to(self.view.stages[stage].node_id)

    async def connect_neighbours(self) -> None:
        """Handshake now with every stage this one initiates to (stage 0 at start, so no step waits)."""
        if not self.security.secure:
            return
        last = self.view.num_stages - 1
        for target in sorted({self.stage + 1, last} if self.stage == 0 else {self.stage + 1}):
            if self.stage < target <= last:
                await self._channel(target)

    async def send_activations(
        self, step: engine_pb2.StepBatch, dtype: str, shape: list[int], hidden: bytes, *, failed: bool = False
    ) -> None:
        """Hidden states of `step` to the next stage (or, `failed`, word that this step failed)."""
        target = self.stage + 1
        header = security_pb2.FrameHeader(
            plan_version=self.epoch,
            stage=target,
            step_id=step.step_id,
            dtype=dtype,
            shape=shape,
            kind=KIND_FAILED if failed else KIND_ACTIVATIONS,
            sent_at=time.time(),
        )
        channel = await self._channel(target)
        subject = names.activation_subject(
            self.view.stages[target].node_id, self.epoch, self.pipeline, target
        )
        for message in encode_frames(header, activation_payload(step, hidden), self.nc.max_payload, channel):
            await self.nc.publish(subject, message)

    async def send_result(self, result: bus_pb2.StepResult) -> None:
        header = security_pb2.FrameHeader(
            plan_version=self.epoch,
            stage=0,
            step_id=result.step_id,
            kind=KIND_RESULT,
            sent_at=time.time(),
        )
        channel = await self._channel(0)
        subject = names.activation_subject(self.view.stages[0].node_id, self.epoch, self.pipeline, 0)
        for message in encode_frames(header, result.SerializeToString(), self.nc.max_payload, channel):
            await self.nc.publish(subject, message)

    def receive(self, message: bytes) -> tuple[security_pb2.FrameHeader, bytes] | None:
        """The whole frame once its last chunk is in; None meanwhile or when a message was rejected."""
        try:
            header, chunk = self._opener.open(message)
        except AuthenticationError as exc:
            self.security.reject(exc, stage=self.stage, epoch=self.epoch)
            return None
        except FrameError as exc:
            self.security.reject(AuthenticationError("malformed", str(exc)), stage=self.stage)
            return None
        if header.plan_version != self.epoch or header.stage != self.stage:
            return None
        try:
            return self._assembler.add(header, chunk)
        except FrameError as exc:
            self.security.reject(AuthenticationError("malformed", str(exc)), stage=self.stage)
            return None
