"""The transport-free stage API: one step of one stage, from a batch description and hidden states.

Stage 0's scheduler describes each step as a `StepBatch`: per sequence, where its new tokens start,
how many there are (with their ids, which only stage 0 embeds), the KV blocks added to its table
since the last step, whether to sample, and — the first time a sequence (re)appears — what the last
stage needs to sample it. Messages carry deltas; each `Stage` keeps the block tables and sampling
state of the sequences it has seen and drops them when they are freed. The distributed pipeline puts
exactly these messages on the bus; the in-process engine calls the stages one after another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mohawk_shard.engine.backend import Backend
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.model.forward_batch import ForwardBatch


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """What a stage needs to know of a sequence that joins (or rejoins after preemption)."""

    num_prompt_tokens: int
    params: SamplingParams
    output_token_ids: tuple[int, ...] = ()
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served when it (re)joined
    latency_budget_ms: float = 0.0  # the request's target time per output token (0 = none)


@dataclass(frozen=True, slots=True)
class SequenceStep:
    seq_id: int
    start_position: int
    token_ids: tuple[int, ...]
    new_block_ids: tuple[int, ...]
    sample: bool
    new_sequence: SequenceSpec | None = None

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class StepBatch:
    step_id: int
    sequences: tuple[SequenceStep, ...]
    freed_seq_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class StageOutput:
    step_id: int
    hidden_states: Any | None = None
    sampled: tuple[tuple[int, SampledToken], ...] = ()


@dataclass(slots=True)
class _SequenceState:
    params: SamplingParams
    output_token_ids: list[int]
    block_tables: list[list[int]] = field(default_factory=list)  # one per KV group


class Stage:
    """Layers [start, end) behind a backend, with the per-sequence state the step deltas build up.

    With several KV groups (`mohawk_common.kv_groups`, `num_kv_groups` from the model config) a
    step's new block ids come group after group, as many for each."""

    def __init__(self, backend: Backend, block_size: int, num_kv_groups: int = 1) -> None:
        self.backend = backend
        self.block_size = block_size
        self.num_kv_groups = num_kv_groups
        self._sequences: dict[int, _SequenceState] = {}

    @property
    def num_sequences(self) -> int:
        return len(self._sequences)

    def step(self, batch: StepBatch, hidden_states: Any | None = None) -> StageOutput:
        for seq_id in batch.freed_seq_ids:
            self._sequences.pop(seq_id, None)
        if not batch.sequences:
            return StageOutput(batch.step_id)
        chunks = []
        more_tables = []
        for step in batch.sequences:
            state = self._state_for(step)
            per_group = len(step.new_block_ids) // self.num_kv_groups
            for group, table in enumerate(state.block_tables):
                table.extend(step.new_block_ids[group * per_group : (group + 1) * per_group])
            chunks.append((list(step.token_ids), step.start_position, state.block_tables[0], step.sample))
            more_tables.append(state.block_tables[1:])
        group_tables = more_tables if self.num_kv_groups > 1 else ()
        forward = ForwardBatch.build(chunks, self.block_size, group_tables=group_tables)
        output = self.backend.forward(forward, hidden_states)
        if not self.backend.has_head:
            return StageOutput(batch.step_id, hidden_states=output)
        return StageOutput(batch.step_id, sampled=self._sample(batch, output))

    def _state_for(self, step: SequenceStep) -> _SequenceState:
        if step.new_sequence is not None:
            spec = step.new_sequence
            tables: list[list[int]] = [[] for _ in range(self.num_kv_groups)]
            self._sequences[step.seq_id] = _SequenceState(spec.params, list(spec.output_token_ids), tables)
        state = self._sequences.get(step.seq_id)
        if state is None:
            raise KeyError(f"stage got a step for unknown sequence {step.seq_id}")
        return state

    def _sample(self, batch: StepBatch, logits: Any) -> tuple[tuple[int, SampledToken], ...]:
        steps = [s for s in batch.sequences if s.sample]
        if not steps:
            return ()
        states = [self._sequences[s.seq_id] for s in steps]
        tokens = self.backend.sample(logits, [s.params for s in states], [s.output_token_ids for s in states])
        for state, token in zip(states, tokens, strict=True):
            state.output_token_ids.append(token.token_id)
        return tuple((s.seq_id, t) for s, t in zip(steps, tokens, strict=True))
