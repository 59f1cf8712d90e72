"""Bodies of /v1/chat/completions: `ChatCompletionCreate` in, completion and chunks out."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from mohawk_gateway.schemas.common import (
    INT32_MAX,
    MAX_LOGPROBS,
    RequestModel,
    SamplingFields,
    UsagePublic,
)

ROLE_ALIASES = {"developer": "system"}


def _content_text(value: Any) -> Any:
    """OpenAI's list-of-parts content as one string (text parts only, joined by newlines)."""
    if not isinstance(value, list):
        return value
    texts: list[str] = []
    for part in value:
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"only text content parts are supported (got {kind!r})")
        text = part.get("text")
        if not isinstance(text, str):
            raise ValueError("a text content part needs a string 'text'")
        texts.append(text)
    return "\n".join(texts)


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | None = Field(None, validate_default=True)
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _parts_to_text(cls, value: Any) -> Any:
        return _content_text(value)

    @field_validator("content")
    @classmethod
    def _content_required(cls, value: str | None, info: ValidationInfo) -> str | None:
        role = info.data.get("role")
        if value is None and role not in (None, "assistant"):
            raise ValueError(f"a {role} message needs content")
        return value

    def for_template(self) -> dict[str, str]:
        return {"role": ROLE_ALIASES.get(self.role, self.role), "content": self.content or ""}


class ChatCompletionCreate(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not value:
            raise ValueError("must hold at least one message")
        return value

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("tool calling is not supported")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value and value.get("type", "text") != "text":
            raise ValueError(f"only the 'text' response format is supported (got {value.get('type')!r})")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs set to true")
        return value

    @property
    def num_logprobs(self) -> int | None:
        """Alternatives per token the engine should return; None = no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TopLogprobPublic(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobPublic(TopLogprobPublic):
    top_logprobs: list[TopLogprobPublic] = []


class ChatLogprobsPublic(BaseModel):
    content: list[TokenLogprobPublic] | None = None


class ChatMessagePublic(BaseModel):
    role: str = "assistant"
    content: str


class ChatChoicePublic(BaseModel):
    index: int = 0
    message: ChatMessagePublic
    logprobs: ChatLogprobsPublic | None = None
    finish_reason: str | None


class ChatCompletionPublic(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoicePublic]
    usage: UsagePublic
    system_fingerprint: str | None = None


class ChatDeltaPublic(BaseModel):
    role: str | None = None
    content: str | None = None


class ChatChunkChoicePublic(BaseModel):
    index: int = 0
    delta: ChatDeltaPublic
    logprobs: ChatLogprobsPublic | None = None
    finish_reason: str | None = None


class ChatCompletionChunkPublic(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoicePublic]
    usage: UsagePublic | None = None
