"""What the clients record as it happens: one `RequestLog` per request, and every 429 by tenant.

Design. Times are seconds since the run's start, on one monotonic clock. A request's log keeps
`queued_at` (when its client wanted to send it), `sent_at` (when the attempt that was answered went
out, after any waits on 429s), `first_token_at`, the arrival time of every chunk that carried text,
and `num_tokens` from the final usage chunk. Tokens are placed in time by those chunks; the rare
token whose event carried no text (a character split across tokens) is placed at the last chunk
(`token_stamps`). A request ends ok or with one error kind, a short string:

    http_<status>:<code>     an error answer (status and OpenAI error code), 429s never: they are retried
    stream_<status>:<code>   an error event inside the SSE stream (status from the error's type)
    hung                     no byte of the answer within the stall timeout
    timeout                  connecting, sending or waiting for a pooled connection timed out
    transport:<Exception>    the connection broke
    lost                     the stream ended without [DONE] and a finish reason
    bad_answer               a body or event that is not JSON

`error_class` sorts kinds into what the acceptance checks count: hung, lost, 5xx, 4xx, timeout.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

RequestKind = Literal["session.create", "session.turn", "session.delete", "chat"]
GENERATION_KINDS: frozenset[str] = frozenset({"session.turn", "chat"})
ErrorClass = Literal["hung", "lost", "5xx", "4xx", "timeout"]

# OpenAI error types as the gateway writes them, back to the status it would have answered.
STATUS_OF_TYPE = {
    "invalid_request_error": 400,
    "not_found_error": 404,
    "rate_limit_error": 429,
    "server_error": 500,
    "service_unavailable": 503,
    "timeout": 504,
}


@dataclass
class RequestLog:
    tenant: str
    kind: RequestKind
    queued_at: float
    sent_at: float = 0.0
    first_token_at: float | None = None
    ended_at: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    num_tokens: int = 0
    num_prompt_tokens: int = 0  # from the usage chunk
    num_cached_tokens: int = 0  # of those, served by the prefix cache (usage.prompt_tokens_details)
    error: str | None = None
    num_refusals: int = 0

    @property
    def generates(self) -> bool:
        return self.kind in GENERATION_KINDS

    @property
    def ok(self) -> bool:
        return self.ended_at is not None and self.error is None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    def token_stamps(self) -> list[float]:
        """One time per generated token: each text chunk's, the rest (usage counts more tokens
        than chunks carried text) at the last chunk."""
        stamps = list(self.chunk_times)
        if stamps and self.num_tokens > len(stamps):
            stamps += [stamps[-1]] * (self.num_tokens - len(stamps))
        return stamps

    def computed_stamps(self) -> list[float]:
        """One time per token the pipeline computed for this request, the unit stage 0's fair share
        counts: its prompt tokens not served by the prefix cache, at the first token (the prefill
        ends there), then the generated ones."""
        stamps = self.token_stamps()
        if not stamps or self.first_token_at is None:
            return stamps
        prefilled = max(0, self.num_prompt_tokens - self.num_cached_tokens)
        return [self.first_token_at] * prefilled + stamps

    def gaps(self) -> list[tuple[float, float]]:
        """(arrival, gap since the chunk before) for every text chunk after the first."""
        times = self.chunk_times
        return [(later, later - earlier) for earlier, later in itertools.pairwise(times)]


@dataclass(frozen=True)
class Refusal:
    """One 429 answer."""

    tenant: str
    at: float
    code: str | None
    retry_after_s: float | None
    has_ratelimit_headers: bool
    reason: str | None = None  # the gateway's X-Mohawk-Refusal (tenant_rate_limit, ttft_objective, ...)


def error_class(kind: str) -> ErrorClass:
    if kind == "hung":
        return "hung"
    if kind == "timeout":
        return "timeout"
    if kind in ("lost", "bad_answer") or kind.startswith("transport:"):
        return "lost"
    status = kind.split(":", 1)[0].rsplit("_", 1)[-1]
    return "5xx" if status.isdigit() and int(status) >= 500 else "4xx"


def stream_error_kind(error: object) -> str:
    """The kind of an error event met inside an SSE stream (`{"error": {...}}`)."""
    body = error if isinstance(error, dict) else {}
    status = STATUS_OF_TYPE.get(str(body.get("type")), 500)
    return f"stream_{status}:{body.get('code')}"


class Recorder:
    """The run's logs, in the order requests were queued; `now()` is seconds since the start."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._start = clock()
        self.requests: list[RequestLog] = []
        self.refusals: list[Refusal] = []
        self.not_sent: Counter[str] = Counter()  # tenant -> turns never sent, their session having failed

    def now(self) -> float:
        return self._clock() - self._start

    def begin(self, tenant: str, kind: RequestKind) -> RequestLog:
        log = RequestLog(tenant, kind, queued_at=self.now())
        self.requests.append(log)
        return log

    def refused(
        self,
        log: RequestLog,
        code: str | None,
        retry_after_s: float | None,
        has_ratelimit_headers: bool,
        reason: str | None = None,
    ) -> None:
        log.num_refusals += 1
        refusal = Refusal(log.tenant, self.now(), code, retry_after_s, has_ratelimit_headers, reason)
        self.refusals.append(refusal)

    def end(self, log: RequestLog, error: str | None = None) -> None:
        log.ended_at = self.now()
        log.error = error
