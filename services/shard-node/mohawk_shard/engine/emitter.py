"""`TokenEmitter`: sampled tokens in, token events out — text deltas, stop conditions, finish reasons.

Whoever samples owns one: the in-process engine, or the last stage of a distributed pipeline, which
publishes the events to the gateway and tells stage 0 only the token and whether the sequence
ended. A sequence is tracked from its first sampled step to its end; a sequence that rejoins
(after preemption, or on a new pipeline after recovery) brings the tokens it already emitted, so
its events continue at the next index with text that joins up. Each event also says how many
sequences its step ran and whether that step took longer than the request's latency budget; the
emitter counts those misses (`num_budget_missed`) and warns about them at most every few seconds.
A sequence's record also carries whatever its owner routes its events by (`route`: the last stage
of a pipeline keeps the request's event box and span there), so one map holds all it knows of it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog

from mohawk_shard.engine.detokenizer import PROMPT_WINDOW, IncrementalDetokenizer, StopStringMatcher
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.request_output import RequestOutput
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.step_time import Throttle

log = structlog.get_logger("mohawk.shard.engine")
R = TypeVar("R")  # what the emitter's owner keeps with each sequence (None in-process)


@dataclass(slots=True)
class _Tracked(Generic[R]):
    request_id: str
    params: SamplingParams
    num_prompt_tokens: int
    num_output_tokens: int
    detokenizer: IncrementalDetokenizer
    stop_matcher: StopStringMatcher
    num_cached_tokens: int = 0
    latency_budget_ms: float = 0.0
    route: R | None = None


# Emitted tokens a restart replays: pending text never spans more than a few byte tokens.
_RESUME_REPLAY = 16


class TokenEmitter(Generic[R]):
    def __init__(self, tokenizer: Any, eos_token_ids: Sequence[int], max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self._tracked: dict[int, _Tracked[R]] = {}
        self.num_budget_missed = 0  # tokens whose step overran their request's latency budget
        self._missed_warning = Throttle()
        self._missed_at_warning = 0

    def track(
        self,
        seq_id: int,
        request_id: str,
        params: SamplingParams,
        num_prompt_tokens: int,
        prompt_tail: Sequence[int],
        output_token_ids: Sequence[int] = (),
        num_cached_tokens: int = 0,
        latency_budget_ms: float = 0.0,
        route: R | None = None,
    ) -> None:
        """Start (or restart) tracking a sequence; `output_token_ids` were already emitted;
        `route`: what the owner keeps with it (`route(seq_id)` gives it back while it is tracked).

        A restart replays the last emitted tokens through a fresh detokenizer and stop matcher, so
        text they still held back (half a multi-byte character, the start of a possible stop
        string) is where it was, and comes out with the next token as it would have."""
        replayed = list(output_token_ids[-_RESUME_REPLAY:])
        before = output_token_ids[: len(output_token_ids) - len(replayed)]
        detokenizer = IncrementalDetokenizer(self.tokenizer, [*prompt_tail, *before][-PROMPT_WINDOW:])
        stop_matcher = StopStringMatcher(params.stop)
        for token_id in replayed:  # none of them ended the sequence, so each went through both
            stop_matcher.feed(detokenizer.add(token_id))
        self._tracked[seq_id] = _Tracked(
            request_id,
            params,
            num_prompt_tokens,
            len(output_token_ids),
            detokenizer,
            stop_matcher,
            num_cached_tokens,
            latency_budget_ms,
            route,
        )

    def note_cached(self, seq_id: int, num_cached_tokens: int) -> None:
        """The prompt tokens the prefix cache served when the sequence was admitted (for usage)."""
        tracked = self._tracked.get(seq_id)
        if tracked is not None:
            tracked.num_cached_tokens = num_cached_tokens

    def route(self, seq_id: int) -> R | None:
        """What the owner keeps with `seq_id` (None when it is not tracked, or kept nothing)."""
        tracked = self._tracked.get(seq_id)
        return None if tracked is None else tracked.route

    def drop(self, seq_id: int) -> None:
        self._tracked.pop(seq_id, None)

    def emit(
        self, seq_id: int, token: SampledToken, *, batch_size: int = 0, step_s: float = 0.0
    ) -> RequestOutput | None:
        """The event for one sampled token, made by a step of `batch_size` sequences that took
        `step_s` seconds; a finished sequence stops being tracked. None if unknown."""
        tracked = self._tracked.get(seq_id)
        if tracked is None:
            return None
        budget_missed = 0 < tracked.latency_budget_ms < step_s * 1000
        if budget_missed:
            self._note_missed(tracked, step_s)
        tracked.num_output_tokens += 1
        params = tracked.params
        reason = None
        text = ""
        stopped_by_string = False
        if (
            token.token_id in self.eos_token_ids and not params.ignore_eos
        ) or token.token_id in params.stop_token_ids:
            reason = "stop"
        else:
            text, stopped = tracked.stop_matcher.feed(tracked.detokenizer.add(token.token_id))
            if stopped:
                reason, stopped_by_string = "stop", True
        num_tokens = tracked.num_prompt_tokens + tracked.num_output_tokens
        if reason is None and (
            (params.max_tokens is not None and tracked.num_output_tokens >= params.max_tokens)
            or num_tokens >= self.max_model_len
        ):
            reason = "length"
        if reason is not None:
            if not stopped_by_string:
                text += tracked.stop_matcher.flush()
            del self._tracked[seq_id]
        return RequestOutput(
            tracked.request_id,
            tracked.num_output_tokens - 1,
            token.token_id,
            text,
            tracked.num_prompt_tokens,
            tracked.num_output_tokens,
            token.logprob,
            token.top_logprobs,
            reason,
            tracked.num_cached_tokens,
            batch_size,
            budget_missed,
        )

    def _note_missed(self, tracked: _Tracked[R], step_s: float) -> None:
        self.num_budget_missed += 1
        if self._missed_warning.ready(time.monotonic()):
            log.warning(
                "steps overran their requests' latency budgets",
                num_missed=self.num_budget_missed - self._missed_at_warning,
                request_id=tracked.request_id,
                budget_ms=tracked.latency_budget_ms,
                step_ms=round(step_s * 1000, 3),
            )
            self._missed_at_warning = self.num_budget_missed
