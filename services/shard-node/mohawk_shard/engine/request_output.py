"""`RequestOutput`: one token event of one request, as the engine reports it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """Token number `index` of a request, the text it completes, and whether the request ended.

    `text` is a delta: concatenating every event's text gives the completion. A final event may
    carry no token (`token_id` None), e.g. when a request is cancelled.
    """

    request_id: str
    index: int
    token_id: int | None
    text: str
    num_prompt_tokens: int
    num_output_tokens: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    finish_reason: str | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    batch_size: int = 0  # sequences in the step that produced this token
    budget_missed: bool = False  # that step took longer than the request's latency budget

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
