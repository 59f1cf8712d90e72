"""Adaptive batching by latency budget: the step-time fit, the cap it sets, and misses on the events."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.core import EngineCore
from mohawk_shard.engine.emitter import TokenEmitter
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.scheduler import Scheduler, SchedulerConfig
from mohawk_shard.engine.sequence import QoS
from mohawk_shard.engine.stage import StepBatch
from mohawk_shard.engine.step_time import StepLine, StepTimeModel


class Letters:
    """A tokenizer of one letter per id: the emitter only decodes."""

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + t % 26) for t in token_ids)


def line_model(fixed_s: float, per_token_s: float, sizes: range = range(1, 17)) -> StepTimeModel:
    model = StepTimeModel()
    for n in sizes:
        model.record(n, fixed_s + per_token_s * n)
    return model


def test_the_fit_recovers_a_line_and_picks_the_largest_step_that_fits() -> None:
    model = line_model(0.010, 0.002)
    line = model.line
    assert line is not None
    assert line.fixed_s == pytest.approx(0.010) and line.per_token_s == pytest.approx(0.002)
    assert model.max_batch(0.030) == 10  # 10 ms + 10 × 2 ms
    assert model.max_batch(0.0309) == 10
    assert model.max_batch(0.005) == 1  # never below one: even one token misses this budget


def test_the_fit_before_and_with_one_size_only() -> None:
    model = StepTimeModel()
    assert model.max_batch(0.030) is None  # nothing measured: nothing capped
    model.record(4, 0.020)
    model.record(4, 0.020)
    assert model.estimate_s(8) == pytest.approx(0.040)  # no fixed cost known: proportional
    assert model.max_batch(0.030) == 6
    assert StepLine(0.010, 0.0).max_batch(0.030) > 1_000  # a step that costs nothing per token


def core_with(model: StepTimeModel, num_blocks: int = 256) -> EngineCore:
    config = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512, max_model_len=256)
    core = EngineCore(Scheduler(config, BlockManager(num_blocks, 4)), vocab_size=1000)
    core.step_times = model
    return core


def sample(core: EngineCore, batch: StepBatch) -> None:
    for step in batch.sequences:
        if step.sample:
            core.apply_token(step.seq_id, 5, finished=False)


def test_a_budget_caps_the_step_to_what_fits_it() -> None:
    core = core_with(line_model(0.010, 0.002))
    for i in range(16):
        budget = 30.0 if i == 0 else 0.0
        core.add_request(f"r{i}", [i + 1], SamplingParams(), qos=QoS(latency_budget_ms=budget))
    first = core.next_batch()
    assert first is not None and len(first.sequences) == 16  # nothing ran yet: no budget applied
    sample(core, first)
    assert core.budget_limit() == 10
    second = core.next_batch()
    assert second is not None and len(second.sequences) == 10
    assert second.sequences[0].seq_id == 0  # the tightest budget's own sequence runs
    sample(core, second)
    third = core.next_batch(num_groups=4)  # micro-batches: the smaller cap wins
    assert third is not None and len(third.sequences) == 4


def test_a_budget_also_chunks_prefills_to_fit() -> None:
    core = core_with(line_model(0.010, 0.002))
    core.add_request("budget", [1, 2], SamplingParams(), qos=QoS(latency_budget_ms=20.0))  # 5 tokens
    batch = core.next_batch()
    assert batch is not None
    sample(core, batch)
    core.add_request("long", list(range(1, 41)), SamplingParams())
    batch = core.next_batch()
    assert batch is not None
    assert [s.num_new_tokens for s in batch.sequences] == [1, 4]  # decode first, then a 4-token chunk


def test_no_budget_no_cap() -> None:
    core = core_with(line_model(0.010, 0.002))
    for i in range(16):
        core.add_request(f"r{i}", [i + 1], SamplingParams())
    batch = core.next_batch()
    assert batch is not None
    sample(core, batch)
    assert core.budget_limit() is None
    batch = core.next_batch()
    assert batch is not None and len(batch.sequences) == 16


def test_events_say_batch_size_and_budget_missed() -> None:
    emitter = TokenEmitter(Letters(), [], 8192)
    params = SamplingParams(temperature=0.0, max_tokens=10)
    emitter.track(0, "tight", params, 3, [1, 2, 3], latency_budget_ms=10.0)
    emitter.track(1, "none", params, 3, [1, 2, 3])
    slow = emitter.emit(0, SampledToken(42), batch_size=3, step_s=0.020)
    fast = emitter.emit(0, SampledToken(42), batch_size=2, step_s=0.005)
    unbudgeted = emitter.emit(1, SampledToken(42), batch_size=3, step_s=10.0)
    assert slow is not None and slow.budget_missed and slow.batch_size == 3
    assert fast is not None and not fast.budget_missed and fast.batch_size == 2
    assert unbudgeted is not None and not unbudgeted.budget_missed
    assert emitter.num_budget_missed == 1
