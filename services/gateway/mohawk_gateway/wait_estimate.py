"""Admission by predicted wait: when would a request arriving now get its first token?

Design. Every request this gateway has admitted and that has no token yet waits for its first one,
and the rate at which requests get it is measured over the last `window_s`, in all and by tenant.
By Little's law a wait is the work ahead over the rate it drains at, and stage 0 orders that work
as its fair queue does: priority classes strictly (a `high` request waits only for `high` work),
then tenants by weight. So a request of tenant T waits for the requests of higher classes, at the
whole rate, and then for T's own, at T's rate: `higher / rate + own / rate_T` (nothing ahead, no
wait: at a light load the rate is low because few ask, not because the pipeline is slow), where T's
rate is the larger of what T measured and what its weight guarantees it while backlogged (the whole
rate times T's weight over the weights of the tenants waiting beside it): a tenant that sent little
lately is not judged by its own small rate, and a tenant over its share waits for its own queue.
With no first token at all in the window (a cold start, a pipeline that stopped) no first token
came since the oldest request ahead arrived, so the rate is under one over its age and the wait at
least the requests ahead times that age (the age alone, as a first version had it, lets a burst
that arrives before the first token in whole). A request counts as waiting from the moment it is
admitted (`admit`, before it is tokenized), not from its submission a few milliseconds later:
clients that come back together after the same Retry-After were otherwise all admitted against the
same count. One over its objective (its tenant's `ttft_objective_s`, else the gateway's) is refused
with 429 before any work is spent on it, `Retry-After` the time the queue needs to drain to the
objective at that rate. The estimate is the gateway's own: several gateways each see their own
requests and their own share of the first tokens, which stay in proportion. What the tenant's
requests really waited for their first tokens in the last `RECENT_S` (the median) is a floor under
the prediction while it has requests ahead: the model leaves out what the gateway cannot see (room
in stage 0's running set, its own backlog), and measured waits bring it back. Pure bookkeeping on
the caller's clock.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mohawk_common.tenancy import PRIORITIES

_RANK: dict[str, int] = {priority: rank for rank, priority in enumerate(PRIORITIES)}  # lower: first
PENDING_S = 10.0  # an admitted request not submitted by then (refused later, failed) stops counting
RECENT_S = 5.0  # the first tokens whose waits are the measured floor of a prediction


@dataclass(slots=True)
class _Waiting:
    tenant: str
    weight: float
    rank: int
    since: float


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted wait for the first token, and what it was made from."""

    wait_s: float
    ahead: int  # requests waiting for their first token before this one
    rate_per_s: float  # the rate this request's own turn drains at (0: no first token in the window)

    def retry_after_s(self, objective_s: float) -> int:
        """Seconds until a request would be predicted within `objective_s` (at least 1)."""
        return max(1, math.ceil(self.wait_s - objective_s))


class WaitEstimate:
    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._pending: deque[_Waiting] = deque()  # admitted, not yet submitted
        self._waiting: dict[str, _Waiting] = {}  # request id -> submitted, no token yet
        self._firsts: deque[tuple[float, str, float]] = deque()  # (when, tenant, its wait) each
        self._started = clock()

    def admit(self, tenant: str, weight: float, priority: str) -> None:
        """A request let in: it waits from now (its submission takes it over)."""
        self._pending.append(_Waiting(tenant, weight, _rank(priority), self._clock()))

    def submitted(self, request_id: str, tenant: str, weight: float, priority: str) -> None:
        admitted = next((w for w in self._pending if w.tenant == tenant), None)
        if admitted is not None:
            self._pending.remove(admitted)
        since = admitted.since if admitted is not None else self._clock()
        self._waiting[request_id] = _Waiting(tenant, weight, _rank(priority), since)

    def first_token(self, request_id: str) -> None:
        waiting = self._waiting.pop(request_id, None)
        if waiting is not None:
            now = self._clock()
            self._firsts.append((now, waiting.tenant, now - waiting.since))

    def closed(self, request_id: str) -> None:
        """The request ended (with no token, if it is still counted as waiting)."""
        self._waiting.pop(request_id, None)

    def predict(self, tenant: str, weight: float, priority: str) -> Prediction:
        now = self._clock()
        while self._firsts and now - self._firsts[0][0] > self.window_s:
            self._firsts.popleft()
        while self._pending and now - self._pending[0].since > PENDING_S:
            self._pending.popleft()
        rank = _rank(priority)
        everyone = [*self._pending, *self._waiting.values()]
        higher = [w for w in everyone if w.rank < rank]
        peers = [w for w in everyone if w.rank == rank]
        own = [w for w in peers if w.tenant == tenant]
        ahead = len(higher) + len(own)
        span = min(self.window_s, max(1e-3, now - self._started))
        rate = len(self._firsts) / span
        if rate == 0.0:  # none came since the oldest ahead arrived: the rate is under 1 / its age
            oldest = min((w.since for w in (*higher, *own)), default=now)
            return Prediction(ahead * (now - oldest), ahead, 0.0)
        weights = {w.tenant: w.weight for w in peers}
        weights[tenant] = weight
        share = rate * weight / sum(weights.values())  # what its weight guarantees it while backlogged
        own_rate = max(share, sum(t == tenant for _, t, _ in self._firsts) / span)
        predicted = len(higher) / rate + len(own) / own_rate
        if own:  # what its tenant's requests waited lately is a floor: the model may be wrong
            recent = sorted(w for at, t, w in self._firsts if t == tenant and now - at <= RECENT_S)
            predicted = max(predicted, recent[len(recent) // 2] if recent else 0.0)
        return Prediction(predicted, ahead, own_rate)


def _rank(priority: str) -> int:
    return _RANK.get(priority, _RANK["normal"])
