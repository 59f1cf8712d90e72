"""A stage's share of one step, written once for every role: run its layers, then pass the hidden
states on or, on the last stage, sample and publish the tokens.

Design. Stage 0 of a one-stage pipeline and the last stage of a longer one run the same last-stage
step: follow the sequences that join or leave, run the layers, sample, make the token events
(`TokenPublisher.sample_step`; the role sends the results, then the events) and count what was
emitted (`sample`). Every other stage forwards: it runs its layers and encodes the hidden states
for the next hop (`forward`). Hidden states are
decoded, computed on and encoded on the compute thread, where the backend's arrays live (MLX
streams belong to the thread that made them). The roles add only the bus: where frames come from
and go to, results, and spans. A stopped role lets its stage go (`release`): whatever still holds
the role (a cycle through its tasks' frames, a subscription's callback) then holds no weights or
KV pool, which are freed as soon as the node lets go of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import Executor

from mohawk_proto.v1 import engine_pb2
from mohawk_shard.engine.kv_mirror import StepMirror
from mohawk_shard.engine.stage import Stage, StageOutput, StepBatch
from mohawk_shard.node.snapshot import StepStats
from mohawk_shard.node.tokens import SampledStep, TokenPublisher
from mohawk_shard.node.wire import EncodedMirror, Joining, mirror_spans

Hidden = tuple[str, list[int], bytes]  # encoded hidden states: dtype, shape, bytes ("", [], b"": none)
Mirror = engine_pb2.KvMirror  # a step's KV mirrored to the node holding a stage's layers on standby


class StageCompute:
    def __init__(
        self, stage: Stage, executor: Executor, tokens: TokenPublisher | None, stats: StepStats
    ) -> None:
        self.stage: Stage | None = stage
        self.executor = executor
        self.tokens = tokens  # set on the last stage, which samples
        self.stats = stats

    def record(self, batch: StepBatch) -> None:
        """Count a step this stage runs (the telemetry service reads the counters)."""
        self.stats.record(sum(s.num_new_tokens for s in batch.sequences), len(batch.sequences))

    async def forward(
        self, batch: StepBatch, hidden: Hidden | None, mirror: Mirror | None = None
    ) -> tuple[Hidden, EncodedMirror | None]:
        """Run the layers on `batch` (`hidden`: the previous stage's output, None on stage 0;
        `mirror`: its KV of the step, for this node's standby) and encode the hidden states, and
        the KV this stage mirrors (`Stage.mirror_kv`, for `wire.write_mirror`), for the next stage."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self._forward, batch, hidden, mirror)

    async def sample(
        self,
        batch: StepBatch,
        joining: Mapping[int, Joining],
        hidden: Hidden | None,
        started_at: float,
        mirror: Mirror | None = None,
    ) -> SampledStep:
        """The last stage's step: run the layers and sample (`started_at`: unix seconds stage 0
        began the step); the caller sends the results, then has the events published."""
        tokens = self.tokens
        if tokens is None:
            raise RuntimeError("only the last stage samples")
        loop = asyncio.get_running_loop()
        sampled = await tokens.sample_step(
            batch,
            joining,
            lambda: loop.run_in_executor(self.executor, self._step, batch, hidden, mirror),
            started_at,
        )
        self.stats.emitted += len(sampled.results)
        return sampled

    def release(self) -> None:
        """The role stopped: let go of the stage (a step still on the compute thread finishes)."""
        self.stage = None

    def _live_stage(self) -> Stage:
        stage = self.stage
        if stage is None:
            raise RuntimeError("the stage was let go: its role stopped")
        return stage

    def _step(self, batch: StepBatch, hidden: Hidden | None, mirror: Mirror | None = None) -> StageOutput:
        """On the compute thread: arrays are made where they are used (MLX streams are per thread)."""
        stage = self._live_stage()
        states = None if hidden is None else stage.backend.decode_hidden(*hidden)
        kept = None
        if mirror is not None:
            packed = stage.backend.decode_hidden(mirror.dtype, list(mirror.shape), mirror.data)
            kept = StepMirror((mirror.layer_start, mirror.layer_end), mirror_spans(mirror), packed)
        return stage.step(batch, states, kept)

    def _forward(
        self, batch: StepBatch, hidden: Hidden | None, mirror: Mirror | None
    ) -> tuple[Hidden, EncodedMirror | None]:
        stage = self._live_stage()
        output = self._step(batch, hidden, mirror)
        sent = output.mirror
        out = (
            None
            if sent is None
            else EncodedMirror(sent.layers, sent.spans, stage.backend.encode_hidden(sent.packed))
        )
        if output.hidden_states is None:
            return ("", [], b""), out
        return stage.backend.encode_hidden(output.hidden_states), out
