"""`SamplingParams`: how one request turns logits into tokens, checked once at the door.

The fields and their meaning follow the OpenAI API (and vLLM where OpenAI is silent). The model is
frozen, so a request's parameters can be shared between the engine's layers without copies.
`SamplingParams.create` is the entry point for user input: it turns pydantic's errors into one
readable `InvalidRequestError` line that names the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from mohawk_common.errors import InvalidRequestError

MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20
# Temperatures below this count as 0: dividing logits by them overflows float32.
GREEDY_TEMPERATURE_EPS = 1e-5


def _between(low: float, high: float, *, low_open: bool = False) -> Callable[[Any], Any]:
    """An after-validator for `low <= v <= high` (or `low < v` when `low_open`); rejects NaN."""
    bracket = "(" if low_open else "["

    def check(value: Any) -> Any:
        above = value > low if low_open else value >= low
        if not (above and value <= high):  # NaN fails both comparisons
            if low_open:
                raise ValueError(f"must be in {bracket}{low:g}, {high:g}]")
            raise ValueError(f"must be between {low:g} and {high:g}")
        return value

    return check


def _at_least(low: int) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is not None and value < low:
            raise ValueError(f"must be at least {low}")
        return value

    return check


def _normalise_top_k(value: Any) -> Any:
    if value == -1:
        return 0
    if isinstance(value, int) and value < 0:
        raise ValueError("must be 0 or -1 (off) or at least 1")
    return value


def _stop_to_tuple(value: Any) -> Any:
    if isinstance(value, str):
        return (value,)
    if value is None:
        return ()
    return value


def _check_stop(value: tuple[str, ...]) -> tuple[str, ...]:
    if len(value) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed (got {len(value)})")
    if any(not s for s in value):
        raise ValueError("must not contain an empty string")
    return value


def _check_token_ids(value: tuple[int, ...]) -> tuple[int, ...]:
    if any(t < 0 for t in value):
        raise ValueError("token ids must not be negative")
    return value


Penalty = Annotated[float, AfterValidator(_between(-2.0, 2.0))]


class SamplingParams(BaseModel):
    """Sampling settings of one request (OpenAI semantics; penalties apply to output tokens)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: Annotated[float, AfterValidator(_between(0.0, 2.0))] = 1.0
    top_p: Annotated[float, AfterValidator(_between(0.0, 1.0, low_open=True))] = 1.0
    top_k: Annotated[int, BeforeValidator(_normalise_top_k)] = 0
    seed: int | None = None
    max_tokens: Annotated[int | None, AfterValidator(_at_least(1))] = None
    min_tokens: Annotated[int, AfterValidator(_at_least(0))] = 0
    stop: Annotated[tuple[str, ...], BeforeValidator(_stop_to_tuple), AfterValidator(_check_stop)] = ()
    stop_token_ids: Annotated[tuple[int, ...], AfterValidator(_check_token_ids)] = ()
    ignore_eos: bool = False
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logprobs: Annotated[int | None, AfterValidator(_between(0, MAX_LOGPROBS))] = None

    @field_validator("min_tokens")
    @classmethod
    def _min_within_max(cls, value: int, info: ValidationInfo) -> int:
        max_tokens = info.data.get("max_tokens")
        if max_tokens is not None and value > max_tokens:
            raise ValueError(f"must not exceed max_tokens ({max_tokens})")
        return value

    @property
    def is_greedy(self) -> bool:
        """True when sampling is argmax: temperature 0 (below 1e-5 counts as 0) or top_k 1."""
        return self.temperature < GREEDY_TEMPERATURE_EPS or self.top_k == 1

    @classmethod
    def create(cls, **kwargs: Any) -> SamplingParams:
        """Build from user input; a bad value raises `InvalidRequestError` naming the field."""
        try:
            return cls(**kwargs)
        except ValidationError as exc:
            raise InvalidRequestError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    """One line for the first error, e.g. 'invalid sampling parameter top_p: must be ... (got 3.0)'."""
    error = exc.errors(include_url=False)[0]
    loc = error["loc"]
    name = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    if error["type"] == "extra_forbidden":
        return f"invalid sampling parameter {name}: unknown parameter"
    message = str(error["msg"]).removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    if "(got " in message:
        return f"invalid sampling parameter {name}: {message}"
    value = error.get("input")
    shown = repr(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"invalid sampling parameter {name or 'value'}: {message} (got {shown})"
