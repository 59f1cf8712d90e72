"""Step deadlines: a floor before anything is measured, then the measured round trip scaled by size."""

from __future__ import annotations

from mohawk_shard.node.step_deadlines import StepDeadlines


def test_a_first_step_gets_the_floor_and_expires_after_it() -> None:
    deadlines = StepDeadlines(floor_s=5.0, factor=4.0)
    assert deadlines.sent(1, num_tokens=40, now=100.0) == 105.0
    assert deadlines.overdue(104.9) == []
    assert deadlines.overdue(105.0) == [1]
    assert deadlines.overdue(200.0) == []  # given up once, not again
    assert deadlines.num_expired == 1
    assert not deadlines.returned(1, now=106.0)  # a late result is not a measurement


def test_measured_round_trips_scale_the_deadline_with_the_steps_size() -> None:
    deadlines = StepDeadlines(floor_s=1.0, factor=4.0)
    for step_id in range(20):  # decode steps of 8 tokens, 0.2 s a round trip
        deadlines.sent(step_id, num_tokens=8, now=float(step_id))
        assert deadlines.returned(step_id, now=step_id + 0.2)
    assert abs(deadlines.expected_s(8) - 0.2) < 1e-9
    decode = deadlines.sent(100, num_tokens=8, now=0.0)
    prefill = deadlines.sent(101, num_tokens=512, now=0.0)
    assert abs(decode - (1.0 + 4 * 0.2)) < 1e-9
    assert abs(prefill - (1.0 + 4 * 0.2 / 8 * 512)) < 1e-9  # a big chunk is expected to take longer
    assert deadlines.overdue(2.0) == [100]
    assert len(deadlines) == 1


def test_overdue_steps_come_oldest_deadline_first() -> None:
    deadlines = StepDeadlines(floor_s=1.0)
    deadlines.sent(7, num_tokens=1, now=2.0)
    deadlines.sent(3, num_tokens=1, now=1.0)
    deadlines.sent(9, num_tokens=1, now=5.0)
    assert deadlines.overdue(4.0) == [3, 7]
