"""Request fields both generation endpoints share (sampling, as OpenAI and vLLM name them), and usage.

Validation mirrors the shard's `SamplingParams` rules (ranges, stop strings, top_k), so a request
the gateway accepts is one the engine accepts. Types are strict: `"0.5"` is not a number and `1`
is not a boolean, as with OpenAI; fields this API does not know are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class RequestModel(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(RequestModel):
    include_usage: bool | None = False


class SamplingFields(RequestModel):
    """Fields of /v1/chat/completions and /v1/completions that steer generation."""

    model: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    min_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    stop: Any = None
    stop_token_ids: list[TokenId] | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    n: int | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    ignore_eos: bool | None = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: Any) -> list[str]:
        stops = [value] if isinstance(value, str) else [] if value is None else value
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ValueError("must be a string or a list of strings")
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed (got {len(stops)})")
        if any(not s for s in stops):
            raise ValueError("must not contain an empty string")
        return stops

    @field_validator("top_k")
    @classmethod
    def _check_top_k(cls, value: int | None) -> int | None:
        return 0 if value == -1 else value

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError(f"only n=1 is supported (got {value})")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens served from the prefix cache, not computed again


class UsagePublic(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ModelPublic(BaseModel):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "mohawk"
    root: str | None = None
    max_model_len: int | None = None


class ModelListPublic(BaseModel):
    object: str = "list"
    data: list[ModelPublic]
