"""`LLMEngine`: requests in, token events out, over a chain of stages run in this process.

The request table, validation, step batches and token application are the `EngineCore`'s (shared
with the bus head); this driver adds the in-process transport. Each `step()` takes the core's next
batch, runs the stages in order, and turns the last stage's sampled tokens into `RequestOutput`
events: the `TokenEmitter` detokenizes each token and decides whether the request ends (EOS, a stop
token or string, `max_tokens` or the context length), and the core appends it. Finished and
cancelled requests free their KV blocks at once. Each step's wall time feeds the core's step-time
fit (the latency-budget cap) and goes with its tokens' events (`budget_missed`, `batch_size`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from mohawk_shard.engine.core import EngineCore
from mohawk_shard.engine.emitter import TokenEmitter
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.request_output import RequestOutput
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.scheduler import Scheduler
from mohawk_shard.engine.sequence import Priority, QoS
from mohawk_shard.engine.sequence import Sequence as Seq
from mohawk_shard.engine.stage import Stage


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished request, as `LLMEngine.generate` returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[float | None]
    top_logprobs: list[tuple[tuple[int, float], ...]]


class LLMEngine:
    def __init__(
        self,
        stages: Sequence[Stage],
        scheduler: Scheduler,
        tokenizer: Any,
        *,
        eos_token_ids: Sequence[int],
        vocab_size: int,
    ) -> None:
        self.stages = list(stages)
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        self.max_model_len = scheduler.config.max_model_len
        self.emitter: TokenEmitter[None] = TokenEmitter(tokenizer, eos_token_ids, self.max_model_len)
        self.core = EngineCore(scheduler, vocab_size=vocab_size, on_finish=self._forget)
        self._batch_ids = itertools.count()

    @property
    def num_unfinished(self) -> int:
        return self.core.num_unfinished

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        tenant: str = "",
        priority: Priority = Priority.NORMAL,
        weight: float = 1.0,
        latency_budget_ms: float = 0.0,
    ) -> None:
        """Queue a request; raises InvalidRequestError for anything that could never be served.

        `tenant` ("" = anonymous) shares the engine with other tenants of its `priority` class by
        `weight`; `latency_budget_ms` (0 = none) is a target time per output token."""
        qos = QoS.create(tenant, priority, weight, latency_budget_ms)
        seq = self.core.add_request(request_id, prompt_token_ids, params, qos=qos)
        self.emitter.track(
            seq.seq_id,
            request_id,
            params,
            seq.num_prompt_tokens,
            self.core.prompt_tail(seq),
            latency_budget_ms=qos.latency_budget_ms,
        )

    def abort_request(self, request_id: str) -> bool:
        """Cancel a request; its KV blocks are free when this returns. False if it was not running."""
        return self.core.abort_request(request_id) is not None

    def step(self) -> list[RequestOutput]:
        batch = self.core.next_batch()
        if batch is None:
            return []
        for step in batch.sequences:
            if step.new_sequence is not None:
                self.emitter.note_cached(step.seq_id, step.new_sequence.num_cached_tokens)
        output = None
        hidden = None
        previous = None
        started = time.perf_counter()
        for stage in self.stages:
            if previous is not None and hidden is not None and previous.name != stage.backend.name:
                # another array library: hand over the raw bytes, as the wire does
                hidden = stage.backend.decode_hidden(*previous.encode_hidden(hidden))
            output = stage.step(batch, hidden)
            hidden = output.hidden_states
            previous = stage.backend
        step_s = time.perf_counter() - started
        self.core.record_step(batch, step_s)
        sampled = output.sampled if output is not None else ()
        size = len(batch.sequences)
        return [
            e for seq_id, token in sampled if (e := self._on_token(seq_id, token, size, step_s)) is not None
        ]

    def run(self) -> Iterator[RequestOutput]:
        """Step until every queued request has finished (and the stages have dropped it), yielding events."""
        while self.core.has_work():
            yield from self.step()

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        """Run `prompts` together to completion (continuous batching), results in prompt order."""
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        batch_id = next(self._batch_ids)
        ids = [f"generate-{batch_id}-{i}" for i in range(len(prompts))]
        for request_id, prompt, p in zip(ids, prompts, per_prompt, strict=True):
            self.add_request(request_id, prompt, p)
        events: dict[str, list[RequestOutput]] = {i: [] for i in ids}
        for event in self.run():
            events[event.request_id].append(event)
        return [_completion(i, list(p), events[i]) for i, p in zip(ids, prompts, strict=True)]

    def _on_token(
        self, seq_id: int, token: SampledToken, batch_size: int, step_s: float
    ) -> RequestOutput | None:
        if self.core.sequence(seq_id) is None:
            return None  # cancelled while its step was in flight
        event = self.emitter.emit(seq_id, token, batch_size=batch_size, step_s=step_s)
        self.core.apply_token(seq_id, token.token_id, finished=event is not None and event.finished)
        return event

    def _forget(self, seq: Seq) -> None:
        self.emitter.drop(seq.seq_id)


def _completion(request_id: str, prompt: list[int], events: list[RequestOutput]) -> Completion:
    return Completion(
        request_id,
        prompt,
        [e.token_id for e in events if e.token_id is not None],
        "".join(e.text for e in events),
        (events[-1].finish_reason or "abort") if events else "abort",
        [e.logprob for e in events],
        [e.top_logprobs for e in events],
    )
