"""What the sampler hands back to the engine for one sequence and one step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SampledToken:
    """One sampled token, with log-probabilities when the request asked for them.

    `logprob` and `top_logprobs` come from the log-softmax of the raw model logits, before
    penalties, temperature and top-k/top-p (vLLM's default). `top_logprobs` holds the k best
    `(token_id, logprob)` pairs, best first.
    """

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
