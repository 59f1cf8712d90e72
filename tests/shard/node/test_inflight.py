"""Stage 0's steps in flight as a plain object on a clock the test passes in: room for one step per
stage, a result takes its step once, an overdue step is no longer awaited (its late result is
ignored), and an overdue step's sequences resume, each once."""

from __future__ import annotations

from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.sequence import Sequence as Seq
from mohawk_shard.engine.stage import SequenceStep, StepBatch
from mohawk_shard.node.inflight import StepsInFlight, overdue_sequences

FLOOR_S = 5.0


def batch(step_id: int, *seq_ids: int, num_tokens: int = 1) -> StepBatch:
    steps = tuple(SequenceStep(s, 0, (1,) * num_tokens, (), True) for s in seq_ids)
    return StepBatch(step_id, steps)


def test_room_for_max_inflight_steps() -> None:
    steps = StepsInFlight(max_inflight=2, deadline_floor_s=FLOOR_S)
    assert steps.has_room()
    steps.sent(batch(0, 1), started=0.0, now=0.1)
    steps.sent(batch(1, 2), started=0.1, now=0.2)
    assert len(steps) == 2 and not steps.has_room()
    taken = steps.returned(0, now=0.5)
    assert taken is not None and taken.started == 0.0 and taken.batch.step_id == 0
    assert steps.has_room()
    assert steps.returned(0, now=0.6) is None  # a result is taken once
    assert steps.returned(7, now=0.6) is None  # never sent from here


def test_an_overdue_step_is_given_up_and_its_late_result_ignored() -> None:
    steps = StepsInFlight(max_inflight=4, deadline_floor_s=FLOOR_S)
    steps.sent(batch(0, 1), started=0.0, now=0.0)
    steps.sent(batch(1, 2), started=1.0, now=1.0)
    assert steps.overdue(now=FLOOR_S - 0.1) == []
    (late,) = steps.overdue(now=FLOOR_S + 0.5)  # step 0's deadline passed, step 1's not yet
    assert late.batch.step_id == 0
    assert steps.num_expired == 1 and len(steps) == 1
    assert steps.returned(0, now=FLOOR_S + 1) is None  # the late result finds nothing
    assert steps.returned(1, now=FLOOR_S + 1) is not None
    assert steps.overdue(now=100.0) == []


def test_the_sequences_of_overdue_steps_resume_each_once_and_only_while_they_run() -> None:
    steps = StepsInFlight(max_inflight=4, deadline_floor_s=FLOOR_S)
    steps.sent(batch(0, 1, 2), started=0.0, now=0.0)
    steps.sent(batch(1, 2, 3), started=0.0, now=0.0)
    running = {s: Seq(s, f"r{s}", [1, 2], SamplingParams()) for s in (1, 2)}  # 3 was cancelled
    seqs = overdue_sequences(steps.overdue(now=FLOOR_S + 1), running.get)
    assert [s.seq_id for s in seqs] == [1, 2]
