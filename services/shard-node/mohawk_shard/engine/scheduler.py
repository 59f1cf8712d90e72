"""Continuous batching for stage 0: which sequences compute how many tokens in the next step.

Design (after vLLM v1). There are no prefill and decode phases: each sequence has
`num_computed_tokens` that catch up with `num_tokens`, and every step hands out a token budget.
Running sequences go first, decoding ones (one token left) before ones still in a chunked
prefill, so generation never stalls behind a long prompt; a prefill takes what budget is left, in
chunks. Waiting sequences are admitted in arrival order while the budget, the sequence cap and
free KV blocks allow (prefix-cache hits cost nothing); when the pool has no room for a running
sequence's next tokens, the most recently admitted running sequence is preempted by recompute:
its blocks are freed and it rejoins the head of the queue, to be re-prefilled from its prompt plus
the tokens it has already produced. In a pipeline several steps are in flight at once: a sequence
whose sampled token has not come back yet has nothing left to compute, so it sits out the next
steps on its own and is never chosen for preemption; `max_seqs` caps a step's sequences so the
running set splits into micro-batches that keep every stage busy. This module imports neither
torch nor MLX.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 8192


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
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._freed_seq_ids: list[int] = []
        self._known_to_stages: set[int] = set()
        self.num_preemptions = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def has_pending_frees(self) -> bool:
        """Sequences freed since the last step, which the stages have not been told to drop yet."""
        return bool(self._freed_seq_ids)

    def num_admittable(self, max_waiting: int) -> int:
        """How many more requests to take in now: free sequence slots, at most `max_waiting` queued,
        and none while the KV pool cannot give every running sequence one more block (whatever is
        not admitted waits upstream: that is the backpressure)."""
        if self.block_manager.num_free_blocks <= len(self.running):
            return 0
        slots = self.config.max_num_seqs - self.num_unfinished
        return max(0, min(slots, max_waiting - len(self.waiting)))

    def can_admit(self, max_waiting: int) -> bool:
        return self.num_admittable(max_waiting) > 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove `seq` (finished, cancelled or failed) and free its KV blocks at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self._release(seq)

    def schedule(self, max_seqs: int | None = None) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        seq_cap = max_seqs if max_seqs is not None else self.config.max_num_seqs
        output = SchedulerOutput()
        preempted = False
        decoding = [s for s in self.running if s.is_decoding]
        prefilling = [s for s in self.running if not s.is_decoding]
        for seq in decoding + prefilling:
            if budget == 0 or len(output.scheduled) >= seq_cap:
                break
            if seq.status is not SequenceStatus.RUNNING or seq.num_uncomputed_tokens == 0:
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            new_blocks = self._allocate_or_preempt(seq, num_new, output)
            if new_blocks is None:  # `seq` itself was preempted
                preempted = True
                continue
            budget -= num_new
            output.scheduled.append(self._take(seq, num_new, new_blocks))
        while (
            self.waiting
            and budget > 0
            and not preempted
            and len(self.running) < self.config.max_num_seqs
            and len(output.scheduled) < seq_cap
        ):
            seq = self.waiting[0]
            computed = self.block_manager.get_computed_blocks(seq)
            num_cached = len(computed) * self.block_manager.block_size
            num_new = min(seq.num_tokens - num_cached, budget)
            new_blocks = self.block_manager.allocate_slots(seq, num_new, computed)
            if new_blocks is None:
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            budget -= num_new
            output.scheduled.append(self._take(seq, num_new, new_blocks))
        output.freed_seq_ids = self._freed_seq_ids
        self._freed_seq_ids = []
        return output

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
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

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
        self.block_manager.cache_full_blocks(seq, seq.num_computed_tokens)
        return ScheduledSequence(seq, start, seq.token_ids[start : start + num_new], new_blocks, is_new)
