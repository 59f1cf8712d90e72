"""Continuous batching for stage 0: which sequences compute how many tokens in the next step.

Design (after vLLM v1). There are no prefill and decode phases: each sequence has
`num_computed_tokens` that catch up with `num_tokens`, and every step hands out a token budget.
Running sequences go first, decoding ones (one token left) before ones still in a chunked
prefill, so generation never stalls behind a long prompt; a prefill takes what budget is left, in
chunks. Waiting sequences are admitted in fair-share order (`fair_queue.py`: priority classes
strictly, tenants by weighted virtual time, arrival order within a tenant) while the budget, the
sequence cap and free KV blocks allow (prefix-cache hits cost nothing); when a step cannot take
every ready running sequence (its sequence cap or token budget is short), the same order picks
who runs, decoding ones still first, and a tenant's decoding sequences take turns. When the pool
has no room for a running sequence's next tokens, the most recently admitted running sequence is
preempted by recompute: its blocks are freed and it rejoins the head of its tenant's queue, to be
re-prefilled from its prompt plus the tokens it has already produced. In a pipeline several steps
are in flight at once: a sequence whose sampled token has not come back yet has nothing left to
compute, so it sits out the next steps on its own and is never chosen for preemption; `max_seqs`
caps a step's sequences so the running set splits into micro-batches that keep every stage busy,
and `max_tokens` lowers a step's token budget (the engine core's latency-budget cap). A request
resumed after a re-plan whose KV stage 0 carried over (`Sequence.num_carried_tokens`) is charged
only the positions stage 0 computes, so its whole history goes in one chunk: the stages after
compute what their own carries lack (`kv_carry.py`), and a failover's resume takes one step, not
one per budget's worth of history. This module imports neither torch nor MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.fair_queue import FairQueue, TenantClocks
from mohawk_shard.engine.sequence import Sequence, SequenceStatus

ADMIT_BURST = 8  # requests a bus head takes in at once (`Scheduler.num_admittable`)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduler's limits, always given: their defaults are `EngineSettings`' (one per setting)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


@dataclass(frozen=True, slots=True)
class ScheduledSequence:
    """One sequence's share of a step: compute `token_ids` at positions from `start_position`."""

    seq: Sequence
    start_position: int
    token_ids: list[int]
    new_block_ids: list[int]
    is_new: bool

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def sample(self) -> bool:
        """True when this chunk reaches the sequence's last known token, so a token gets sampled."""
        return self.start_position + self.num_new_tokens == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    freed_seq_ids: list[int] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.freed_seq_ids


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.clocks = TenantClocks()
        self.waiting = FairQueue(self.clocks)
        self.running: list[Sequence] = []
        self._freed_seq_ids: list[int] = []
        self._known_to_stages: set[int] = set()
        self.num_preemptions = 0
        self._num_served = 0  # sequences scheduled so far, over all steps

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def has_pending_frees(self) -> bool:
        """Sequences freed since the last step, which the stages have not been told to drop yet."""
        return bool(self._freed_seq_ids)

    def num_admittable(self, max_waiting: int, burst: int = ADMIT_BURST) -> int:
        """How many more requests a bus head should take in now (whatever it does not take waits
        upstream, durable: that is the backpressure). None while the KV pool cannot give every
        running sequence one more block (in each KV group). While sequence slots are free, up to
        those slots with at most `burst` queued, so each pull is paced by the steps that admit it
        (and pipelines that share a stream take turns). Once every slot is taken, up to
        `max_waiting` queued, a burst at a time: fair share can only choose among the requests this
        queue holds, and a queue no deeper than the free slots would admit in the stream's arrival
        order."""
        if self.block_manager.num_free_blocks <= len(self.running) * self.block_manager.num_groups:
            return 0
        slots = self.config.max_num_seqs - self.num_unfinished
        if slots > 0:  # a resumed request is work taken in already: the burst paces new work only
            return max(0, min(slots, burst - self.waiting.num_new))
        return max(0, min(burst, max_waiting - len(self.waiting)))

    def can_admit(self, max_waiting: int, burst: int = ADMIT_BURST) -> bool:
        return self.num_admittable(max_waiting, burst) > 0

    def add(self, seq: Sequence) -> None:
        """Queue `seq`: a resumed one (`resumed_at` set) ahead of its tenant's new work."""
        seq.status = SequenceStatus.WAITING
        self.clocks.join(seq)
        if seq.resumed_at:
            self.waiting.append_resumed(seq)
        else:
            self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove `seq` (finished, cancelled or failed) and free its KV blocks at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self.clocks.leave(seq)
        self._release(seq)

    def schedule(self, max_seqs: int | None = None, max_tokens: int | None = None) -> SchedulerOutput:
        """The next step: at most `max_seqs` sequences (default the configured cap) and `max_tokens`
        batched tokens (default, and at most, the configured budget)."""
        budget = self.config.max_num_batched_tokens
        if max_tokens is not None:
            budget = max(1, min(budget, max_tokens))
        seq_cap = max_seqs if max_seqs is not None else self.config.max_num_seqs
        output = SchedulerOutput()
        preempted = False
        for seq in self._ready_in_turn(budget, seq_cap):
            if budget == 0 or len(output.scheduled) >= seq_cap:
                break
            if seq.status is not SequenceStatus.RUNNING or seq.num_uncomputed_tokens == 0:
                continue  # preempted by an earlier one in this loop
            num_new, cost = _chunk(seq, seq.num_computed_tokens, seq.num_uncomputed_tokens, budget)
            new_blocks = self._allocate_or_preempt(seq, num_new, output)
            if new_blocks is None:  # `seq` itself was preempted
                preempted = True
                continue
            budget -= cost
            output.scheduled.append(self._take(seq, num_new, new_blocks))
        while (
            (head := self.waiting.peek()) is not None
            and budget > 0
            and not preempted
            and len(self.running) < self.config.max_num_seqs
            and len(output.scheduled) < seq_cap
        ):
            computed = self.block_manager.get_computed_blocks(head)
            num_cached = self.block_manager.num_hit_tokens(computed)
            num_new, cost = _chunk(head, num_cached, head.num_tokens - num_cached, budget)
            new_blocks = self.block_manager.allocate_slots(head, num_new, computed)
            if new_blocks is None:
                break
            self.waiting.remove(head)
            head.status = SequenceStatus.RUNNING
            self.running.append(head)
            budget -= cost
            output.scheduled.append(self._take(head, num_new, new_blocks))
        output.freed_seq_ids = self._freed_seq_ids
        self._freed_seq_ids = []
        return output

    def _ready_in_turn(self, budget: int, seq_cap: int) -> list[Sequence]:
        """Running sequences with tokens to compute, decoding ones first. When the step cannot take
        them all, each group comes in fair-share order, a tenant's decoding sequences least
        recently run first; otherwise in admission order."""
        ready = [s for s in self.running if s.num_uncomputed_tokens > 0]
        decoding = [s for s in ready if s.is_decoding]
        prefilling = [s for s in ready if not s.is_decoding]
        if len(ready) > seq_cap or sum(s.num_uncomputed_tokens for s in ready) > budget:

            def cost(s: Sequence) -> int:
                return min(s.num_uncomputed_tokens, budget)

            decoding.sort(key=lambda s: s.last_served)
            decoding = self.clocks.order(decoding, cost)
            prefilling = self.clocks.order(prefilling, cost)
        return decoding + prefilling

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, output: SchedulerOutput) -> list[int] | None:
        while True:
            new_blocks = self.block_manager.allocate_slots(seq, num_new)
            if new_blocks is not None:
                return new_blocks
            scheduled = {s.seq.seq_id for s in output.scheduled}
            victims = [
                s
                for s in self.running
                if s is seq or (s.seq_id not in scheduled and s.num_uncomputed_tokens > 0)
            ]
            victim = victims[-1]
            self._preempt(victim)
            if victim is seq:
                return None

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_carried_tokens = 0  # its carry was claimed: every position is computed again
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)  # the head of its tenant's queue

    def _release(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        if seq.seq_id in self._known_to_stages:
            self._known_to_stages.discard(seq.seq_id)
            self._freed_seq_ids.append(seq.seq_id)

    def _take(self, seq: Sequence, num_new: int, new_blocks: list[int]) -> ScheduledSequence:
        start = seq.num_computed_tokens
        is_new = seq.seq_id not in self._known_to_stages
        self._known_to_stages.add(seq.seq_id)
        seq.num_computed_tokens += num_new
        self._num_served += 1
        seq.last_served = self._num_served
        self.clocks.charge(seq, num_new)
        self.block_manager.cache_full_blocks(seq, seq.num_computed_tokens)
        return ScheduledSequence(seq, start, seq.token_ids[start : start + num_new], new_blocks, is_new)


def _chunk(seq: Sequence, start: int, room: int, budget: int) -> tuple[int, int]:
    """How many of `seq`'s next `room` tokens from position `start` a step with `budget` left
    takes, and what they cost it: positions stage 0 carried are free."""
    free = max(0, seq.num_carried_tokens - start)
    num_new = min(room, budget + free)
    return num_new, num_new - min(num_new, free)
