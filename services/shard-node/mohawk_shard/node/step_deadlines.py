"""When an in-flight pipeline step is overdue: a deadline per step from the measured round trips.

Design. Stage 0 sends a step's activations to stage 1 and waits for the last stage's result. A
frame lost on the way (a NATS server restarted under it, a stage killed mid-step) means that
result never comes, and without a deadline its sequences would wait forever. Each step gets
`floor_s + factor × expected`, where `expected` scales the moving average of recent round trips
by the step's size: a round trip is a fixed cost per stage plus a cost per batched token, and a
128-token prefill chunk may take far longer than the decode steps before it, so the average round
trip per token (over steps of at least one token) is kept beside the average round trip, and a
step's expectation is the larger of the two estimates. The floor keeps a first step, before
anything was measured, and a slow machine's ordinary jitter from expiring; the factor covers
queueing behind the steps in flight before it. Pure bookkeeping on a clock the caller passes in.
"""

from __future__ import annotations

from dataclasses import dataclass

DEADLINE_FACTOR = 4.0  # a step is given up after the floor plus this many expected round trips

_SMOOTHING = 0.2  # weight of the newest round trip in the moving averages


@dataclass(frozen=True, slots=True)
class _InFlight:
    sent_at: float
    num_tokens: int
    deadline: float


class StepDeadlines:
    def __init__(self, floor_s: float, factor: float = DEADLINE_FACTOR) -> None:
        self.floor_s, self.factor = floor_s, factor
        self._inflight: dict[int, _InFlight] = {}
        self._round_trip_s: float | None = None
        self._per_token_s: float | None = None
        self.num_expired = 0

    def __len__(self) -> int:
        return len(self._inflight)

    def expected_s(self, num_tokens: int) -> float:
        """The round trip a step of `num_tokens` batched tokens is expected to take (0 before any)."""
        per_step = self._round_trip_s or 0.0
        per_token = (self._per_token_s or 0.0) * num_tokens
        return max(per_step, per_token)

    def sent(self, step_id: int, num_tokens: int, now: float) -> float:
        """Track a step sent at `now`; returns its deadline."""
        deadline = now + self.floor_s + self.factor * self.expected_s(num_tokens)
        self._inflight[step_id] = _InFlight(now, max(1, num_tokens), deadline)
        return deadline

    def returned(self, step_id: int, now: float) -> bool:
        """The step's result arrived: learn its round trip. False when it was not in flight
        (expired already, or never sent by this driver)."""
        step = self._inflight.pop(step_id, None)
        if step is None:
            return False
        took = max(0.0, now - step.sent_at)
        self._round_trip_s = _blend(self._round_trip_s, took)
        self._per_token_s = _blend(self._per_token_s, took / step.num_tokens)
        return True

    def overdue(self, now: float) -> list[int]:
        """Steps past their deadline, oldest first; they are no longer tracked."""
        late = sorted((s.deadline, step_id) for step_id, s in self._inflight.items() if s.deadline <= now)
        for _, step_id in late:
            del self._inflight[step_id]
        self.num_expired += len(late)
        return [step_id for _, step_id in late]


def _blend(average: float | None, sample: float) -> float:
    return sample if average is None else (1 - _SMOOTHING) * average + _SMOOTHING * sample
