"""How long a step takes as a function of its size, and the largest step that fits a latency budget.

Design. A step's time is close to a line in the tokens it computes, t(n) = a + b·n: a fixed cost
(weights read once per step, per-step overhead, and in a pipeline the hops) plus a cost per token
(a decoding sequence computes one token, so for decode steps n is the batch size; a prefill chunk
counts each of its tokens). The line is a least-squares fit over the last `window` measured steps,
so it follows the machine, the context lengths and, at a pipeline's stage 0, the round trip as it
runs with its other micro-batches in flight. With samples at one size only, the fit assumes no
fixed cost (t grows in proportion to n: cautious above that size); with none, nothing is known and
nothing is capped. `max_batch(budget)` is the largest n with t(n) ≤ budget, never below 1: a budget
that even one token overruns is reported by whoever measures the step, not met by starving it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOW = 64  # recent steps the line is fitted over
_MAX_BATCH = 1 << 20  # "no limit" when the cost per token is nil


@dataclass(frozen=True, slots=True)
class StepLine:
    """t(n) = fixed_s + per_token_s · n."""

    fixed_s: float
    per_token_s: float

    def estimate_s(self, num_tokens: int) -> float:
        return max(0.0, self.fixed_s + self.per_token_s * num_tokens)

    def max_batch(self, budget_s: float) -> int:
        """The largest n whose estimated step fits `budget_s`, at least 1."""
        if self.per_token_s <= 0:
            return _MAX_BATCH if self.fixed_s <= budget_s else 1
        fits = math.floor((budget_s - self.fixed_s) / self.per_token_s + 1e-9)
        return max(1, min(_MAX_BATCH, fits))


class StepTimeModel:
    """Measured steps in, the fitted `StepLine` out (None until a step was measured)."""

    def __init__(self, window: int = WINDOW) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=window)
        self._line: StepLine | None = None

    @property
    def num_samples(self) -> int:
        return len(self._samples)

    def record(self, num_tokens: int, seconds: float) -> None:
        """A step of `num_tokens` batched tokens took `seconds` (steps of no tokens are not kept)."""
        if num_tokens <= 0 or not math.isfinite(seconds) or seconds < 0:
            return
        self._samples.append((num_tokens, seconds))
        self._line = None

    @property
    def line(self) -> StepLine | None:
        if self._line is None and self._samples:
            self._line = _fit(self._samples)
        return self._line

    def estimate_s(self, num_tokens: int) -> float | None:
        line = self.line
        return None if line is None else line.estimate_s(num_tokens)

    def max_batch(self, budget_s: float) -> int | None:
        """The largest step (in tokens) that fits `budget_s`; None while nothing was measured."""
        line = self.line
        return None if line is None else line.max_batch(budget_s)


def _fit(samples: deque[tuple[int, float]]) -> StepLine:
    count = len(samples)
    mean_n = sum(n for n, _ in samples) / count
    mean_t = sum(t for _, t in samples) / count
    spread = sum((n - mean_n) ** 2 for n, _ in samples)
    if spread == 0:  # one size only: no fixed cost known, assume none
        return StepLine(0.0, mean_t / mean_n)
    slope = sum((n - mean_n) * (t - mean_t) for n, t in samples) / spread
    return StepLine(mean_t - slope * mean_n, slope)


class Throttle:
    """At most one go every `every_s` seconds (for warnings that could otherwise come every step)."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self._last = -math.inf

    def ready(self, now: float) -> bool:
        if now - self._last < self.every_s:
            return False
        self._last = now
        return True
