"""The step every role shares (`StageCompute`), with a stand-in stage: it runs on the compute
thread, decodes what the previous stage sent, encodes what it passes on, counts the step, and
only the last stage samples."""

from __future__ import annotations

import asyncio
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from mohawk_shard.engine.stage import SequenceStep, StageOutput, StepBatch
from mohawk_shard.node.compute import StageCompute
from mohawk_shard.node.snapshot import StepStats


class FakeBackend:
    def decode_hidden(self, dtype: str, shape: list[int], data: bytes) -> Any:
        return ("decoded", dtype, tuple(shape), data)

    def encode_hidden(self, hidden: Any) -> tuple[str, list[int], bytes]:
        return "f16", [1, 2], repr(hidden).encode()


class FakeStage:
    def __init__(self, hidden_out: Any) -> None:
        self.backend = FakeBackend()
        self.hidden_out = hidden_out
        self.seen: list[tuple[Any, str]] = []

    def step(self, batch: StepBatch, hidden: Any, mirror: Any = None) -> StageOutput:
        self.seen.append((hidden, threading.current_thread().name))
        return StageOutput(batch.step_id, hidden_states=self.hidden_out)


BATCH = StepBatch(3, (SequenceStep(0, 0, (5, 6, 7), (), False), SequenceStep(1, 4, (8,), (), True)))


Hidden = tuple[str, list[int], bytes]


def run_forward(stage: FakeStage, hidden: Hidden | None) -> Hidden:
    with ThreadPoolExecutor(1, thread_name_prefix="compute") as executor:
        compute = StageCompute(stage, executor, None, StepStats())  # type: ignore[arg-type]
        out, mirror = asyncio.run(compute.forward(BATCH, hidden))
        assert mirror is None  # the stage mirrored nothing
        return out


def test_forward_decodes_steps_and_encodes_on_the_compute_thread() -> None:
    stage = FakeStage(hidden_out="h")
    assert run_forward(stage, ("bf16", [2], b"xy")) == ("f16", [1, 2], b"'h'")
    ((hidden, thread),) = stage.seen
    assert hidden == ("decoded", "bf16", (2,), b"xy") and thread.startswith("compute")


def test_stage_0_forwards_without_input_and_no_output_encodes_as_empty() -> None:
    stage = FakeStage(hidden_out=None)
    assert run_forward(stage, None) == ("", [], b"")
    assert stage.seen[0][0] is None


def test_record_counts_the_step_and_only_the_last_stage_samples() -> None:
    stats = StepStats()
    with ThreadPoolExecutor(1) as executor:
        compute = StageCompute(FakeStage(None), executor, None, stats)  # type: ignore[arg-type]
        compute.record(BATCH)
        assert (stats.steps, stats.tokens, stats.sequences) == (1, 4, 2)
        with pytest.raises(RuntimeError, match="only the last stage samples"):
            asyncio.run(compute.sample(BATCH, {}, None, 0.0))


def test_a_released_stage_is_no_longer_held_and_a_late_step_says_so() -> None:
    """A stopped role lets its stage go: whatever still refers to the role (its ended tasks'
    frames, a subscription's callback) then keeps no weights or KV pool alive."""
    stage = FakeStage(hidden_out="h")
    gone = weakref.ref(stage)
    with ThreadPoolExecutor(1, thread_name_prefix="compute") as executor:
        compute = StageCompute(stage, executor, None, StepStats())  # type: ignore[arg-type]
        compute.release()
        del stage
        assert gone() is None, "the released stage is still held by its compute"
        with pytest.raises(RuntimeError, match="its role stopped"):
            asyncio.run(compute.forward(BATCH, None))
