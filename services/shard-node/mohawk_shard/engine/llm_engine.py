"""`LLMEngine`: requests in, token events out, over a chain of stages run in this process.

Each `step()` asks the scheduler for the next batch, turns it into the stages' `StepBatch`, runs the
stages in order, and turns the last stage's sampled tokens into `RequestOutput` events: appending
the token and letting the `TokenEmitter` detokenize it and decide whether the request ends (EOS,
a stop token or string, `max_tokens` or the context length). Finished and cancelled requests free
their KV blocks at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from mohawk_common.errors import InvalidRequestError
from mohawk_shard.engine.emitter import TokenEmitter
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.request_output import RequestOutput
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.scheduler import ScheduledSequence, Scheduler, SchedulerOutput
from mohawk_shard.engine.sequence import Sequence as Seq
from mohawk_shard.stage import SequenceSpec, SequenceStep, Stage, StepBatch


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
        self.emitter = TokenEmitter(tokenizer, eos_token_ids, self.max_model_len)
        self._requests: dict[str, Seq] = {}
        self._by_seq_id: dict[int, Seq] = {}
        self._seq_ids = itertools.count()
        self._step_ids = itertools.count()
        self._batch_ids = itertools.count()

    @property
    def num_unfinished(self) -> int:
        return len(self._requests)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Queue a request; raises InvalidRequestError for anything that could never be served."""
        prompt = [int(t) for t in prompt_token_ids]
        self._validate(request_id, prompt)
        seq_id = next(self._seq_ids)
        seq = Seq(seq_id, request_id, prompt, params)
        self.emitter.track(seq_id, request_id, params, len(prompt), prompt)
        self._requests[request_id] = seq
        self._by_seq_id[seq_id] = seq
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> bool:
        """Cancel a request; its KV blocks are free when this returns. False if it was not running."""
        seq = self._requests.get(request_id)
        if seq is None:
            return False
        self._finish(seq)
        return True

    def step(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()
        if scheduled.is_empty:
            return []
        batch = to_step_batch(next(self._step_ids), scheduled)
        output = None
        hidden = None
        previous = None
        for stage in self.stages:
            if previous is not None and hidden is not None and previous.name != stage.backend.name:
                # another array library: hand over the raw bytes, as the wire does
                hidden = stage.backend.decode_hidden(*previous.encode_hidden(hidden))
            output = stage.step(batch, hidden)
            hidden = output.hidden_states
            previous = stage.backend
        sampled = output.sampled if output is not None else ()
        return [event for seq_id, token in sampled if (event := self._on_token(seq_id, token)) is not None]

    def run(self) -> Iterator[RequestOutput]:
        """Step until every queued request has finished (and the stages have dropped it), yielding events."""
        while self.has_unfinished() or self.scheduler.has_pending_frees:
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

    def _validate(self, request_id: str, prompt: list[int]) -> None:
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running")
        if not prompt:
            raise InvalidRequestError("the prompt is empty")
        if len(prompt) >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt)} tokens, but the context holds {self.max_model_len} "
                "(prompt plus at least one generated token)"
            )
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise InvalidRequestError(f"prompt token ids must lie in [0, {self.vocab_size})")

    def _on_token(self, seq_id: int, token: SampledToken) -> RequestOutput | None:
        seq = self._by_seq_id.get(seq_id)
        if seq is None or seq.is_finished:
            return None  # cancelled while its step was in flight
        seq.append_token(token.token_id)
        event = self.emitter.emit(seq_id, token)
        if event is not None and event.finished:
            self._finish(seq)
        return event

    def _finish(self, seq: Seq) -> None:
        self.scheduler.finish(seq)
        self.emitter.drop(seq.seq_id)
        self._requests.pop(seq.request_id, None)
        self._by_seq_id.pop(seq.seq_id, None)


def to_step_batch(step_id: int, scheduled: SchedulerOutput) -> StepBatch:
    """The stages' view of one scheduler step: deltas per sequence, specs for sequences that (re)join."""
    return StepBatch(
        step_id, tuple(_sequence_step(s) for s in scheduled.scheduled), tuple(scheduled.freed_seq_ids)
    )


def _sequence_step(s: ScheduledSequence) -> SequenceStep:
    spec = None
    if s.is_new:
        spec = SequenceSpec(s.seq.num_prompt_tokens, s.seq.params, tuple(s.seq.output_token_ids))
    return SequenceStep(
        s.seq.seq_id, s.start_position, tuple(s.token_ids), tuple(s.new_block_ids), s.sample, spec
    )


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
