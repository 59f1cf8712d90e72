"""What a session is: its QoS and routing hints (as the client gave them, schemas/sessions.py),
its history and its recorded samples, as kept in Redis."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, Field

from mohawk_gateway.schemas.sessions import SessionQoS, SessionRouting

MAX_SAMPLES = 4096  # latency samples kept per kind: the most recent ones


class TurnSamples(BaseModel):
    """One finished turn, as measured at the gateway."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    ttft_s: float
    itl_s: list[float]
    duration_s: float  # arrival to last token
    batch_sizes: list[int]
    budget_missed: int


class SessionState(BaseModel):
    id: str
    # The owning tenant's `owner_id` (its immutable id, never its name), "" = anonymous. A session
    # stored before ids holds the tenant's name under "tenant": it matches no id, so nobody owns it.
    owner_id: str = Field(validation_alias=AliasChoices("owner_id", "tenant"))
    model: str
    created: int
    qos: SessionQoS = Field(default_factory=SessionQoS)
    routing: SessionRouting = Field(default_factory=SessionRouting)
    system_prompt: str | None = None
    messages: list[dict[str, str]] = []  # user and assistant turns, in order
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    generation_s: float = 0.0
    ttft_s: list[float] = []
    itl_s: list[float] = []
    batch_sizes: dict[int, int] = {}  # stage-0 batch size -> tokens computed in one that size
    budget_missed: int = 0

    @staticmethod
    def new(owner_id: str, model: str) -> SessionState:
        return SessionState(
            id=f"sess_{uuid.uuid4().hex}", owner_id=owner_id, model=model, created=int(time.time())
        )

    def conversation(self, user_input: str) -> list[dict[str, str]]:
        """The messages of the next turn: system prompt, history, the new input."""
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*opening, *self.messages, {"role": "user", "content": user_input}]

    def record(self, user_input: str, answer: str, turn: TurnSamples) -> None:
        self.messages += [{"role": "user", "content": user_input}, {"role": "assistant", "content": answer}]
        self.turns += 1
        self.prompt_tokens += turn.prompt_tokens
        self.completion_tokens += turn.completion_tokens
        self.cached_tokens += turn.cached_tokens
        self.generation_s += turn.duration_s
        if turn.completion_tokens:
            self.ttft_s = [*self.ttft_s, turn.ttft_s][-MAX_SAMPLES:]
        self.itl_s = [*self.itl_s, *turn.itl_s][-MAX_SAMPLES:]
        for size in turn.batch_sizes:
            self.batch_sizes[size] = self.batch_sizes.get(size, 0) + 1
        self.budget_missed += turn.budget_missed


RequestStatus = Literal["queued", "running", "completed", "failed"]


class RequestRecord(BaseModel):
    """An asynchronous turn, as `GET /v1/sessions/{id}/requests/{rid}` shows it."""

    id: str
    object: str = "session.request"
    session_id: str
    status: RequestStatus
    created: int
    completed: int | None = None
    result: dict[str, Any] | None = None  # the chat.completion, once completed
    error: dict[str, Any] | None = None  # OpenAI's error object, when failed
