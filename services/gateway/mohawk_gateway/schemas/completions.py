"""Bodies of /v1/completions (OpenAI's legacy text completions): `CompletionCreate` in, completion out."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from mohawk_gateway.schemas.common import INT32_MAX, MAX_LOGPROBS, SamplingFields, UsagePublic


def _is_token_ids(value: list[Any]) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) for t in value)


class CompletionCreate(SamplingFields):
    prompt: Any = Field(..., description="a string or a list of token ids (one prompt per request)")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
            value = value[0]  # a batch of one
        if isinstance(value, str):
            if not value:
                raise ValueError("must not be empty")
            return value
        if isinstance(value, list) and value and _is_token_ids(value):
            if any(not 0 <= t <= INT32_MAX for t in value):
                raise ValueError("token ids must be non-negative 32-bit integers")
            return list(value)
        if isinstance(value, list) and len(value) > 1 and all(isinstance(p, str | list) for p in value):
            raise ValueError("only one prompt per request is supported")
        raise ValueError("must be a non-empty string or a non-empty list of token ids")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("echo is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError(f"only best_of=1 is supported (got {value})")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported")
        return value


class CompletionLogprobsPublic(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoicePublic(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobsPublic | None = None
    finish_reason: str | None = None


class CompletionPublic(BaseModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoicePublic]
    usage: UsagePublic | None = None
    system_fingerprint: str | None = None
