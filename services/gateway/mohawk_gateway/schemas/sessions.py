"""Bodies of the sessions API: `SessionCreate` and `SessionInfer` in, records out."""

from __future__ import annotations

from pydantic import BaseModel, Field

from mohawk_gateway.schemas.common import INT32_MAX, RequestModel, SamplingFields
from mohawk_gateway.sessions.state import SessionQoS, SessionRouting

MAX_SYSTEM_PROMPT_CHARS = 1 << 20


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
