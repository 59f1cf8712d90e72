"""Validated request fields to the engine's `SamplingParams` (OpenAI's defaults where a field is unset)."""

from __future__ import annotations

from mohawk_gateway.errors import invalid
from mohawk_gateway.schemas.common import SamplingFields
from mohawk_proto.v1 import engine_pb2


def build_sampling(
    body: SamplingFields, *, max_tokens: int | None, logprobs: int | None
) -> engine_pb2.SamplingParams:
    """The engine's sampling settings; `max_tokens` and `logprobs` as the endpoint names them."""
    min_tokens = body.min_tokens or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise invalid(f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})", "min_tokens")
    params = engine_pb2.SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        min_tokens=min_tokens,
        stop=body.stop or [],
        stop_token_ids=body.stop_token_ids or [],
        ignore_eos=bool(body.ignore_eos),
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
    )
    if body.seed is not None:
        params.seed = body.seed
    if max_tokens is not None:
        params.max_tokens = max_tokens
    if logprobs is not None:
        params.logprobs = logprobs
    return params
