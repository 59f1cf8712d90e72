"""What watches one generation: the record of its tokens, its metrics, its spans, its report.

Design. A `Generation` (generation.py) moves a request through the bus and decides nothing here;
everything that only watches it lives in `GenerationObservers`, told of four moments: `submitted`
(the request is on the bus), `on_event` (each token event, in order), `cancelled` (it is being
closed unfinished) and `closed` (exactly once, however it ended). Each moment goes to the
gateway's Prometheus metrics (labelled by endpoint), the request's trace spans (`RequestTrace`),
the telemetry report (`RequestReporter`, on close) and the log. The events' own facts gather in a
`TokenRecord`: tokens, when each arrived, stage-0 batch sizes, cached prompt tokens, budget
misses and the text; the renderers' usage, a session turn's samples and the tenant's account of
tokens used read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from mohawk_gateway.metrics import GatewayMetrics
from mohawk_gateway.request_reports import RequestReporter
from mohawk_gateway.request_trace import RequestTrace
from mohawk_gateway.submission import Submission, capped_priority
from mohawk_gateway.wait_estimate import WaitEstimate
from mohawk_proto.v1 import engine_pb2

log = structlog.get_logger("mohawk.gateway")


@dataclass
class TokenRecord:
    """What one generation's token events said, as they came."""

    arrived: float  # loop time the request arrived at; `token_times` count from the same clock
    num_tokens: int = 0
    token_times: list[float] = field(default_factory=list)  # loop time each token arrived
    batch_sizes: list[int] = field(default_factory=list)  # the stage-0 batch each token was computed in
    num_cached_tokens: int = 0
    num_budget_missed: int = 0  # tokens whose step overran the request's latency budget
    texts: list[str] = field(default_factory=list)  # the answer's text, event by event

    @property
    def ttft_s(self) -> float | None:
        """Time to the first token; None before one."""
        return self.token_times[0] - self.arrived if self.token_times else None

    def add(self, event: engine_pb2.TokenEvent, at: float) -> bool:
        """Record an event that arrived at loop time `at`; whether it carried a token."""
        carries = _carries_token(event)
        if carries:
            self.token_times.append(at)
            self.num_tokens += 1
            if event.batch_size:
                self.batch_sizes.append(event.batch_size)
            self.num_budget_missed += event.budget_missed
        self.texts.append(event.text)
        if event.HasField("usage"):
            self.num_cached_tokens = event.usage.cached_tokens
        return carries


class GenerationObservers:
    """One generation's metrics, spans, report and log, fed by its lifecycle."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        reports: RequestReporter,
        model: str,
        submission: Submission,
        arrived: float,
        waits: WaitEstimate | None = None,
    ) -> None:
        self._metrics, self._reports, self._model = metrics, reports, model
        self._waits = waits  # told when the request waits for its first token, and when it ends
        self._request_id = submission.request_id
        self._priority = capped_priority(submission.priority, submission.tenant)
        self._weight = submission.tenant.weight if submission.tenant is not None else 1.0
        self._endpoint = submission.endpoint
        self._tenant = submission.tenant_name
        self._tenant_label = submission.tenant_label  # on the bus: never the name
        self._log = log.bind(request_id=submission.request_id)
        self.record = TokenRecord(arrived)
        self.trace = RequestTrace(
            submission.request_id, self._endpoint, model, self._tenant, submission.num_prompt_tokens
        )

    def submitted(self, num_prompt_tokens: int) -> None:
        if self._waits is not None:
            self._waits.submitted(self._request_id, self._tenant, self._weight, self._priority)
        self._metrics.in_flight.labels(endpoint=self._endpoint).inc()
        self._metrics.prompt_tokens.labels(endpoint=self._endpoint).inc(num_prompt_tokens)
        self._log.info("request submitted", num_prompt_tokens=num_prompt_tokens)

    def not_submitted(self) -> None:
        self.trace.end("not submitted", 0, None)

    def on_event(self, event: engine_pb2.TokenEvent, at: float) -> None:
        """An event that arrived at loop time `at` (an engine error is only traced)."""
        self.trace.on_event(event)
        if event.error or not self.record.add(event, at):
            return
        if self.record.num_tokens == 1:
            if self._waits is not None:
                self._waits.first_token(self._request_id)
            self._metrics.time_to_first_token.labels(endpoint=self._endpoint).observe(
                at - self.record.arrived
            )
        self._metrics.generated_tokens.labels(endpoint=self._endpoint).inc()

    def cancelled(self, reason: str) -> None:
        self._metrics.cancelled.labels(reason=reason).inc()
        self._log.info("request cancelled", reason=reason, num_tokens=self.record.num_tokens)

    def closed(self, outcome: str, elapsed_s: float | None) -> None:
        """The generation ended with `outcome` (ok, failed or why it was cancelled), `elapsed_s`
        after it arrived when it finished (None when it did not)."""
        record = self.record
        if self._waits is not None:
            self._waits.closed(self._request_id)
        self._metrics.in_flight.labels(endpoint=self._endpoint).dec()
        if elapsed_s is not None:
            self._metrics.request_duration.labels(endpoint=self._endpoint).observe(elapsed_s)
        self._reports.record(self._model, self._tenant_label, record.arrived, record.token_times, outcome)
        self.trace.end(outcome, record.num_tokens, record.ttft_s)


def _carries_token(event: engine_pb2.TokenEvent) -> bool:
    """A final event may carry no token (a cancel, a stop found in held-back text)."""
    return not event.finish_reason or bool(event.text) or event.HasField("logprob") or event.token_id != 0
