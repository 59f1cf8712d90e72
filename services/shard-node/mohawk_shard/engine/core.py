"""`EngineCore`: the engine without a transport — requests in, step batches out, sampled tokens back.

Design. Everything that decides what a request is and where it stands lives here, once: the
request table (by request id and by sequence id), prompt validation, adding and aborting,
turning the scheduler's choice into the stages' `StepBatch`, and applying a sampled token (which
may end the sequence, freeing its KV blocks at once). Two drivers sit on top and add only how
tokens travel: `LLMEngine` runs the stages in this process and detokenizes itself; the bus head
(`node/head.py`) sends the batch as activation frames and hears back which token each sequence
got and whether it ended. A driver that keeps state of its own per sequence (a detokenizer, a
message to ack) passes `on_finish`, called whenever a sequence leaves the table for any reason.
With several stages in flight the running set is split into `num_groups` micro-batches: each step
takes at most its share of the unfinished sequences, so every stage has a batch to work on. The
exception is a failover's catch-up: while a request resumed with KV its stage carried over the
re-plan (`num_carried`) waits for its first step, a step is not capped, so every such request
catches up in one step (each computes a position or so, and a micro-batch more would read every
weight again for it: the 1.7B's 16 resumed streams caught up in four steps of four, 0.52 s).

Latency budgets. A request may carry a target time per output token. The driver reports how long
each step took (`record_step`: in process, the stages' wall time; at the bus head, from starting
a step to its result), which feeds a line t(n) = a + b·n over recent steps (`step_time.py`); while
any running sequence has a budget, a step takes at most the n tokens (and so sequences) whose
estimate fits the tightest such budget, never fewer than one. In a pipeline the cap applies to each
micro-batch: a sequence's next token waits for its own step's round trip, which is what is
measured, and that round trip already includes the time the step queues behind the other
micro-batches at each stage, so the fit prices in the pipelining as it runs; shrinking every
micro-batch shortens every round trip. Whoever samples marks a token whose step overran its
request's budget (`TokenEmitter`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence

import structlog

from mohawk_common.errors import InvalidRequestError
from mohawk_shard.engine.detokenizer import PROMPT_WINDOW
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.scheduler import ScheduledSequence, Scheduler, SchedulerOutput
from mohawk_shard.engine.sequence import DEFAULT_QOS, QoS
from mohawk_shard.engine.sequence import Sequence as Seq
from mohawk_shard.engine.stage import SequenceSpec, SequenceStep, StepBatch
from mohawk_shard.engine.step_time import StepTimeModel, Throttle

log = structlog.get_logger("mohawk.shard.engine")


class EngineCore:
    def __init__(
        self,
        scheduler: Scheduler,
        *,
        vocab_size: int,
        on_finish: Callable[[Seq], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.vocab_size = vocab_size
        self.max_model_len = scheduler.config.max_model_len
        self._on_finish = on_finish
        self._requests: dict[str, Seq] = {}
        self._by_seq_id: dict[int, Seq] = {}
        self._catching_up: set[int] = set()  # resumed with a carry, not scheduled yet
        self._seq_ids = itertools.count()
        self._step_ids = itertools.count()
        self.step_times = StepTimeModel()
        self._unreachable_warning = Throttle()

    @property
    def num_unfinished(self) -> int:
        return len(self._requests)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def has_work(self) -> bool:
        """Requests to run, or freed sequences the stages have not been told to drop yet."""
        return self.has_unfinished() or self.scheduler.has_pending_frees

    def request(self, request_id: str) -> Seq | None:
        return self._requests.get(request_id)

    def sequence(self, seq_id: int) -> Seq | None:
        return self._by_seq_id.get(seq_id)

    def check_prompt(self, request_id: str, prompt_token_ids: Sequence[int]) -> list[int]:
        """The prompt as a list; raises InvalidRequestError for anything that could never be served."""
        prompt = [int(t) for t in prompt_token_ids]
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
        return prompt

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        output_token_ids: Sequence[int] = (),
        qos: QoS = DEFAULT_QOS,
        num_carried: int = 0,
    ) -> Seq:
        """Queue a request (`output_token_ids`: tokens it already emitted, when it resumes; `qos`:
        its tenant, priority, weight and latency budget; `num_carried`: positions whose KV this
        node's stage carried over a re-plan)."""
        prompt = self.check_prompt(request_id, prompt_token_ids)
        seq = Seq(next(self._seq_ids), request_id, prompt, params, qos=qos)
        for token_id in output_token_ids:
            seq.append_token(int(token_id))
        if output_token_ids:
            seq.resumed_at = time.monotonic()
            seq.num_carried_tokens = max(0, min(num_carried, seq.num_tokens - 1))
            if seq.num_carried_tokens:
                self._catching_up.add(seq.seq_id)
        self._requests[request_id] = seq
        self._by_seq_id[seq.seq_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort_request(self, request_id: str) -> Seq | None:
        """End a request now (its KV blocks are free when this returns); None if it was not running."""
        seq = self._requests.get(request_id)
        if seq is not None:
            self.finish(seq)
        return seq

    def finish(self, seq: Seq) -> None:
        """Take `seq` out (finished, cancelled or failed): free its blocks, forget it, tell the driver."""
        self.scheduler.finish(seq)
        self._requests.pop(seq.request_id, None)
        self._by_seq_id.pop(seq.seq_id, None)
        self._catching_up.discard(seq.seq_id)
        if self._on_finish is not None:
            self._on_finish(seq)

    def next_batch(self, num_groups: int = 1) -> StepBatch | None:
        """The next step for the stages, None when there is nothing to do."""
        cap = None if num_groups <= 1 else max(1, math.ceil(self.scheduler.num_unfinished / num_groups))
        if self._catching_up:  # a failover's catch-up: one step
            cap = None
        limit = self.budget_limit()
        if limit is not None:
            cap = limit if cap is None else min(cap, limit)
        scheduled = self.scheduler.schedule(max_seqs=cap, max_tokens=limit)
        self._catching_up.difference_update(s.seq.seq_id for s in scheduled.scheduled)
        if scheduled.is_empty:
            return None
        return to_step_batch(next(self._step_ids), scheduled)

    @property
    def is_catching_up(self) -> bool:
        """Whether a request resumed with KV its stage carried waits for its first step."""
        return bool(self._catching_up)

    def record_step(self, batch: StepBatch, seconds: float) -> None:
        """`batch` took `seconds`, from its start to its sampled tokens: this feeds the step-time fit."""
        self.step_times.record(sum(self._num_computed(s) for s in batch.sequences), seconds)

    def _num_computed(self, step: SequenceStep) -> int:
        """Tokens of `step` stage 0 computes (not those its stage carried over a re-plan)."""
        seq = self._by_seq_id.get(step.seq_id)
        carried = seq.num_carried_tokens if seq is not None else 0
        return step.num_new_tokens - max(0, min(step.num_new_tokens, carried - step.start_position))

    def budget_limit(self) -> int | None:
        """The most tokens (so sequences) a step may take to fit the tightest latency budget of the
        running sequences; None when none has a budget or no step was measured yet."""
        budgets = [s.qos.latency_budget_ms for s in self.scheduler.running if s.qos.latency_budget_ms > 0]
        if not budgets:
            return None
        budget_s = min(budgets) / 1000
        limit = self.step_times.max_batch(budget_s)
        if limit == 1:
            one = self.step_times.estimate_s(1) or 0.0
            if one > budget_s and self._unreachable_warning.ready(time.monotonic()):
                log.warning(
                    "a latency budget is below one token's step: steps run one sequence and still miss it",
                    budget_ms=round(budget_s * 1000, 3),
                    estimated_ms=round(one * 1000, 3),
                )
        return limit

    def apply_token(self, seq_id: int, token_id: int, *, finished: bool) -> Seq | None:
        """Append a sampled token (and end the sequence when `finished`); None when the sequence is
        gone already (cancelled while its step was in flight)."""
        seq = self._by_seq_id.get(seq_id)
        if seq is None or seq.is_finished:
            return None
        seq.append_token(token_id)
        if finished:
            self.finish(seq)
        return seq

    def prompt_tail(self, seq: Seq) -> list[int]:
        """The prompt's last tokens, which seed the detokenizer of whoever samples the sequence."""
        return seq.token_ids[: seq.num_prompt_tokens][-PROMPT_WINDOW:]


def to_step_batch(step_id: int, scheduled: SchedulerOutput) -> StepBatch:
    """The stages' view of one scheduler step: deltas per sequence, specs for sequences that (re)join."""
    return StepBatch(
        step_id, tuple(_sequence_step(s) for s in scheduled.scheduled), tuple(scheduled.freed_seq_ids)
    )


def _sequence_step(s: ScheduledSequence) -> SequenceStep:
    spec = None
    if s.is_new:
        seq = s.seq
        spec = SequenceSpec(
            seq.num_prompt_tokens,
            seq.params,
            tuple(seq.output_token_ids),
            seq.num_cached_tokens,
            seq.qos.latency_budget_ms,
            seq.request_id,
        )
    return SequenceStep(
        s.seq.seq_id, s.start_position, tuple(s.token_ids), tuple(s.new_block_ids), s.sample, spec
    )
