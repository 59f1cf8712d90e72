"""Bodies of the sessions API: `SessionCreate` (with the session's QoS and routing hints) and
`SessionInfer` in, records out."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mohawk_gateway.schemas.common import INT32_MAX, RequestModel, SamplingFields

MAX_SYSTEM_PROMPT_CHARS = 1 << 20


class SessionQoS(RequestModel):
    """Quality of service a session asks for; every field optional."""

    priority: Literal["high", "normal", "low"] | None = None  # None: the tenant's own
    latency_budget_ms: float | None = Field(default=None, gt=0, le=600_000)  # target time per output token
    max_tokens_per_turn: int | None = Field(default=None, ge=1, le=INT32_MAX)  # caps each turn's max_tokens
    max_turns: int | None = Field(default=None, ge=1, le=INT32_MAX)
    max_total_tokens: int | None = Field(default=None, ge=1, le=2**62)  # prompt + completion, all turns


class SessionRouting(RequestModel):
    """Routing hints: `affinity` keeps every turn on the pipeline that holds the session's KV prefix
    (prefix-affinity routing on the session, whatever the gateway's routing)."""

    affinity: bool = True


class SessionCreate(RequestModel):
    model: str | None = None
    qos: SessionQoS = Field(default_factory=SessionQoS)
    routing: SessionRouting = Field(default_factory=SessionRouting)
    system_prompt: str | None = Field(default=None, max_length=MAX_SYSTEM_PROMPT_CHARS)


class SessionInfer(SamplingFields):
    """One turn: only the new user input (the history stays on the server), and how to answer it:
    at once (`stream` for SSE) or, with `async`, 202 and a request to poll."""

    input: str = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    background: bool = Field(False, alias="async")

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class SessionDeleted(BaseModel):
    id: str
    object: str = "session.deleted"
    deleted: bool = True
