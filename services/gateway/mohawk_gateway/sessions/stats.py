"""A session's statistics, as `GET /v1/sessions/{id}` answers them, from its recorded samples.

Percentiles are numpy's linear interpolation over the kept samples (the last `MAX_SAMPLES` of
each kind); tokens/s is completion tokens over the summed turn durations (arrival to last token).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from mohawk_gateway.schemas.sessions import SessionQoS, SessionRouting
from mohawk_gateway.sessions.state import SessionState

PERCENTILES = (50, 95, 99)


class LatencyPublic(BaseModel):
    count: int
    p50: float | None
    p95: float | None
    p99: float | None


class TokensPublic(BaseModel):
    prompt: int
    completion: int
    cached: int


class BatchSizesPublic(BaseModel):
    seen: dict[int, int]  # batch size -> tokens computed in a batch that size
    mean: float | None
    max: int | None


class SessionPublic(BaseModel):
    id: str
    object: str = "session"
    created: int
    model: str
    qos: SessionQoS
    routing: SessionRouting
    system_prompt: str | None
    turns: int
    tokens: TokensPublic
    time_to_first_token_ms: LatencyPublic
    inter_token_latency_ms: LatencyPublic
    tokens_per_s: float | None
    batch_sizes: BatchSizesPublic
    budget_missed: int  # tokens whose step took longer than the session's latency budget


def latency_ms(samples_s: list[float]) -> LatencyPublic:
    if not samples_s:
        return LatencyPublic(count=0, p50=None, p95=None, p99=None)
    p50, p95, p99 = (float(v) * 1000.0 for v in np.percentile(np.asarray(samples_s), PERCENTILES))
    return LatencyPublic(count=len(samples_s), p50=p50, p95=p95, p99=p99)


def session_public(state: SessionState) -> SessionPublic:
    sizes = state.batch_sizes
    num_sized = sum(sizes.values())
    return SessionPublic(
        id=state.id,
        created=state.created,
        model=state.model,
        qos=state.qos,
        routing=state.routing,
        system_prompt=state.system_prompt,
        turns=state.turns,
        tokens=TokensPublic(
            prompt=state.prompt_tokens, completion=state.completion_tokens, cached=state.cached_tokens
        ),
        time_to_first_token_ms=latency_ms(state.ttft_s),
        inter_token_latency_ms=latency_ms(state.itl_s),
        tokens_per_s=state.completion_tokens / state.generation_s if state.generation_s > 0 else None,
        batch_sizes=BatchSizesPublic(
            seen=dict(sorted(sizes.items())),
            mean=sum(size * n for size, n in sizes.items()) / num_sized if num_sized else None,
            max=max(sizes) if sizes else None,
        ),
        budget_missed=state.budget_missed,
    )
