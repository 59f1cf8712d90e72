"""Admission by predicted wait: when would a request arriving now get its first token?

Design. Every request this gateway has admitted and that has no token yet waits for its first one,
and the rate at which requests get it is measured over the last `window_s`, in all and by tenant.
By Little's law a wait is the work ahead over the rate it drains at, and stage 0 orders that work
as its fair queue does: priority classes strictly (a `high` request waits only for `high` work),
then tenants by weight. So a request of tenant T waits for the requests of higher classes, at the
whole rate, and then for T's own, at T's rate: `higher / rate + own / rate_T` (nothing ahead, no
wait: at a light load the rate is low because few ask, not because the pipeline is slow), where T's
rate is what its weight guarantees it: the whole rate times T's weight over the weights of the
tenants of its class that wait beside it or got a first token in the last `RECENT_S`. A tenant that
sent little lately is not judged by its own small rate; and one that had the pipeline to itself
for a while is not judged by that rate either: a first version took the larger of the share and
T's measured rate, and under `make loadtest` a low-weight tenant admitted a dozen requests at the
whole rate a moment before the others' clients came back, then waited 5-11 s at its sixth.
With no first token at all in the window (a cold start, a pipeline that stopped) no first token
came since the oldest request ahead arrived, so the rate is under one over its age and the wait at
least the requests ahead times that age (the age alone, as a first version had it, lets a burst
that arrives before the first token in whole). A request counts as waiting from the moment it is
admitted (`admit`, before it is tokenized), not from its submission a few milliseconds later:
clients that come back together after the same Retry-After were otherwise all admitted against the
same count. One predicted past its objective (its tenant's `ttft_objective_s`, else the
gateway's), less the headroom below, is refused with 429 before any work is spent on it,
`Retry-After` the time the queue needs to drain to the admitted wait at that rate. The estimate
is the gateway's own: several gateways each see their own requests and their own share of the
first tokens, which stay in proportion. What the tenant's
requests really waited for their first tokens in the last `RECENT_S` (the median) is a floor under
the prediction while it has requests ahead: the model leaves out what the gateway cannot see (room
in stage 0's running set, its own backlog), and measured waits bring it back.

The model is also corrected by its own record: each admitted request keeps what the model
predicted for it, and when its first token comes the ratio of the real wait to that prediction
is kept for `window_s`; the model's figure is multiplied by the `CALIBRATION_QUANTILE` of the
tenant's ratios (of every tenant's, while it has too few; predictions under `MIN_CALIBRATED_S` are
too small to divide by), so a pipeline slower than its recent first-token rate says (a shared CPU,
longer prompts), or a tenant's share smaller than its recent rate (others came back), is found out
within a window, and a faster one admits more. A request still waiting past its prediction counts
too, with its wait so far (its ratio can only grow): a pipeline that slows is found out while its
requests are late, not one wait later when their first tokens come.

Headroom. A request is admitted while its prediction is within `OBJECTIVE_SHARE` of the
objective, not the whole of it. The prediction is a central figure: a queue held right at the
objective put the median wait near it (4-5 s of a 5 s objective, `make loadtest`), so every slow
second (a burst of returning clients, the host's other work) pushed the top percent past it (p99
6.2-7.5 s in two runs). At 70% of it, p99 was 4.6-5.8 s in four runs, the late ones requests
admitted together when refused clients came back; at 60%, 2.8-3.6 s in three runs, with goodput
0.89-1.03x runs without admission the same day. Such a queue still never runs dry at the rate
the pipeline drains it, so what is refused is wait, not throughput.

A refused request is told when to come back so that the refused come back one at a time, at the
rate the queue drains: the first after the wait down to what the objective admits, each next one a drain
interval later (`1 / rate` for its tenant) than the last one still to come back, up to
`MAX_RETRY_AFTER_S` (what every OpenAI Python client honours; past its limit it uses its own short
backoff). Every refused client given the same Retry-After would come back together, find the queue
full again and be refused again: a storm of refusals that costs the gateway, and the shard beside
it, CPU the pipeline needed. Pure bookkeeping on the caller's clock.
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
CALIBRATION_QUANTILE = 0.95  # of real wait / predicted wait: what the model's figure is scaled by
MIN_CALIBRATED_S = 0.5  # a prediction under this is not divided by
MIN_CALIBRATION_SAMPLES = 10  # fewer ratios than this in the window: no correction
CALIBRATION_BOUNDS = (0.5, 8.0)
MAX_RETRY_AFTER_S = 60.0
# Admit while the prediction is within this share of the objective (see the design: headroom).
OBJECTIVE_SHARE = 0.6


@dataclass(slots=True)
class _Waiting:
    tenant: str
    weight: float
    rank: int
    since: float
    model_s: float = 0.0  # what the model predicted when it was admitted (0: not known)


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted wait for the first token, and what it was made from."""

    wait_s: float
    ahead: int  # requests waiting for their first token before this one
    rate_per_s: float  # the rate this request's own turn drains at (0: no first token in the window)
    model_s: float | None = None  # Little's law alone, before calibration and floor (None: the same)

    @property
    def drain_interval_s(self) -> float:
        """How often one of the requests ahead gets its first token."""
        if self.rate_per_s > 0.0:
            return 1.0 / self.rate_per_s
        return self.wait_s / max(1, self.ahead)


class WaitEstimate:
    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._pending: deque[_Waiting] = deque()  # admitted, not yet submitted
        self._waiting: dict[str, _Waiting] = {}  # request id -> submitted, no token yet
        self._firsts: deque[tuple[float, str, float]] = deque()  # (when, tenant, its wait) each
        self._served: dict[str, tuple[float, float, int]] = {}  # tenant -> its last first token, weight, rank
        self._ratios: deque[tuple[float, str, float]] = deque()  # (when, tenant, real / predicted wait)
        self._returns: dict[str, list[float]] = {}  # tenant -> when its refused were told to return
        self._started = clock()

    def admit(self, tenant: str, weight: float, priority: str, prediction: Prediction | None = None) -> None:
        """A request let in, on `prediction`: it waits from now (its submission takes it over)."""
        model_s = 0.0 if prediction is None else prediction.model_s or prediction.wait_s
        self._pending.append(_Waiting(tenant, weight, _rank(priority), self._clock(), model_s))

    @staticmethod
    def admits(prediction: Prediction, objective_s: float) -> bool:
        """Whether a request predicted `prediction` is let in under `objective_s` (with headroom)."""
        return prediction.wait_s <= OBJECTIVE_SHARE * objective_s

    def refuse(self, tenant: str, prediction: Prediction, objective_s: float) -> int:
        """Seconds a request refused on `prediction` should wait before it comes back (at least 1):
        until the queue is down to what `objective_s` admits, then behind the tenant's refused still
        to return, one drain interval each (see the module's design)."""
        now = self._clock()
        returning = [at for at in self._returns.get(tenant, ()) if at > now]
        after_s = prediction.wait_s - OBJECTIVE_SHARE * objective_s
        if returning:
            after_s = max(after_s, max(returning) - now + prediction.drain_interval_s)
        after_s = min(MAX_RETRY_AFTER_S, max(1.0, after_s))
        self._returns[tenant] = [*returning, now + after_s]
        return math.ceil(after_s)

    def submitted(self, request_id: str, tenant: str, weight: float, priority: str) -> None:
        admitted = next((w for w in self._pending if w.tenant == tenant), None)
        if admitted is not None:
            self._pending.remove(admitted)
        since, model_s = (admitted.since, admitted.model_s) if admitted is not None else (self._clock(), 0.0)
        self._waiting[request_id] = _Waiting(tenant, weight, _rank(priority), since, model_s)

    def first_token(self, request_id: str) -> None:
        waiting = self._waiting.pop(request_id, None)
        if waiting is not None:
            now = self._clock()
            self._firsts.append((now, waiting.tenant, now - waiting.since))
            self._served[waiting.tenant] = (now, waiting.weight, waiting.rank)
            if waiting.model_s >= MIN_CALIBRATED_S:
                self._ratios.append((now, waiting.tenant, (now - waiting.since) / waiting.model_s))

    def closed(self, request_id: str) -> None:
        """The request ended (with no token, if it is still counted as waiting)."""
        self._waiting.pop(request_id, None)

    def predict(self, tenant: str, weight: float, priority: str) -> Prediction:
        now = self._clock()
        while self._firsts and now - self._firsts[0][0] > self.window_s:
            self._firsts.popleft()
        while self._ratios and now - self._ratios[0][0] > self.window_s:
            self._ratios.popleft()
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
        self._served = {t: served for t, served in self._served.items() if now - served[0] <= RECENT_S}
        weights = {t: w for t, (_, w, r) in self._served.items() if r == rank}
        weights.update({w.tenant: w.weight for w in peers})
        weights[tenant] = weight
        own_rate = rate * weight / sum(weights.values())  # what its weight guarantees it beside them
        model_s = len(higher) / rate + len(own) / own_rate
        predicted = model_s * self.calibration(tenant)
        if own:  # what its tenant's requests waited lately is a floor: the model may be wrong
            recent = sorted(w for at, t, w in self._firsts if t == tenant and now - at <= RECENT_S)
            predicted = max(predicted, recent[len(recent) // 2] if recent else 0.0)
        return Prediction(predicted, ahead, own_rate, model_s)

    def calibration(self, tenant: str | None = None) -> float:
        """What the model's figure for `tenant` is multiplied by: the `CALIBRATION_QUANTILE` of
        real over predicted waits in the window, and of the waits so far of requests still waiting
        past their prediction (a ratio at least that large is certain), the tenant's own when it
        has enough, within `CALIBRATION_BOUNDS` (1 with too few to judge)."""
        now = self._clock()
        overdue = [
            (w.tenant, (now - w.since) / w.model_s)
            for w in (*self._pending, *self._waiting.values())
            if w.model_s >= MIN_CALIBRATED_S and now - w.since > w.model_s
        ]
        known = [(t, ratio) for _, t, ratio in self._ratios] + overdue
        ratios = sorted(ratio for t, ratio in known if t == tenant)
        if len(ratios) < MIN_CALIBRATION_SAMPLES:
            ratios = sorted(ratio for _, ratio in known)
        if len(ratios) < MIN_CALIBRATION_SAMPLES:
            return 1.0
        low, high = CALIBRATION_BOUNDS
        return min(high, max(low, ratios[min(len(ratios) - 1, int(CALIBRATION_QUANTILE * len(ratios)))]))


def _rank(priority: str) -> int:
    return _RANK.get(priority, _RANK["normal"])
