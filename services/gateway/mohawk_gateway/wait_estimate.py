"""Admission by predicted wait: when would a request arriving now get its first token?

Design. Every request this gateway has submitted and that has no token yet is waiting for its
first one, and the rate at which such requests get it is measured (first tokens over the last
`window_s`). By Little's law a new request's wait is the work ahead of it over that rate:
`(ahead + 1) / rate`, where `ahead` counts the requests waiting at its priority or higher, since
stage 0 serves priority classes strictly (a `high` request waits only for `high` work). The
estimate is the gateway's own: it sees its own requests and its own share of the first tokens,
which are in the same proportion when several gateways share a pipeline. With no first token in
the window (a cold start, or a pipeline that stopped), the estimate is the age of the oldest
request waiting, which its wait is at least. A request whose estimate is over its objective (its
tenant's `ttft_objective_s`, else the gateway's) is refused with 429 before it is tokenized or
reaches the bus, with `Retry-After` the time the queue needs to drain to the objective at the
measured rate (`refusal`): an OpenAI client's retries then come back when they can be served.
Pure bookkeeping on the caller's clock.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mohawk_common.tenancy import PRIORITIES

_RANK: dict[str, int] = {priority: rank for rank, priority in enumerate(PRIORITIES)}  # lower: first


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted wait for the first token, and what it was made from."""

    wait_s: float
    ahead: int  # requests waiting for their first token at this priority or higher
    rate_per_s: float  # first tokens a second over the window (0: none in it)

    def retry_after_s(self, objective_s: float) -> int:
        """Seconds until a request would be predicted within `objective_s` (at least 1)."""
        return max(1, math.ceil(self.wait_s - objective_s))


class WaitEstimate:
    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._waiting: dict[str, tuple[int, float]] = {}  # request id -> (priority rank, since)
        self._firsts: deque[float] = deque()  # when each first token came, within the window
        self._started = clock()

    def submitted(self, request_id: str, priority: str) -> None:
        self._waiting[request_id] = (_RANK.get(priority, _RANK["normal"]), self._clock())

    def first_token(self, request_id: str) -> None:
        if self._waiting.pop(request_id, None) is not None:
            self._firsts.append(self._clock())

    def closed(self, request_id: str) -> None:
        """The request ended (with no token, if it is still counted as waiting)."""
        self._waiting.pop(request_id, None)

    def predict(self, priority: str) -> Prediction:
        now = self._clock()
        while self._firsts and now - self._firsts[0] > self.window_s:
            self._firsts.popleft()
        rank = _RANK.get(priority, _RANK["normal"])
        ahead = [since for r, since in self._waiting.values() if r <= rank]
        span = min(self.window_s, max(1e-3, now - self._started))
        rate = len(self._firsts) / span
        if not ahead:
            return Prediction(0.0, 0, rate)
        if rate == 0.0:
            return Prediction(now - min(ahead), len(ahead), rate)
        return Prediction((len(ahead) + 1) / rate, len(ahead), rate)
