"""The transport-free stage API: one step of one stage, from a batch description and hidden states.

Stage 0's scheduler describes each step as a `StepBatch`: per sequence, where its new tokens start,
how many there are (with their ids, which only stage 0 embeds), the KV blocks added to its table
since the last step, whether to sample, and — the first time a sequence (re)appears — what the last
stage needs to sample it. Messages carry deltas; each `Stage` keeps the block tables and sampling
state of the sequences it has seen and drops them when they are freed. The distributed pipeline puts
exactly these messages on the bus; the in-process engine calls the stages one after another. A stage
that sends rows on keeps them in a pool beside its KV, slot for slot (given `num_blocks`), so that a
re-plan that stops it hands its successor each request's KV and rows (`export_carry`, `adopt`), a
prefix-cache hit's included: `kv_carry.py` says how a resumed request then skips what a stage holds.
A stage whose layers the next stage's node holds on standby also hands that node each step's KV
(`mirror_kv`, `StageOutput.mirror`), and a stage given such a copy keeps it for its own carry
(`kv_mirror.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mohawk_shard.engine.backend import Backend
from mohawk_shard.engine.kv_carry import (
    CarriedPart,
    CarriesKV,
    Carry,
    ChunkPlan,
    RequestCarry,
    carrier_parts,
    carry_exhausted,
    plan_chunk,
    row_spans,
)
from mohawk_shard.engine.kv_mirror import KvMirrorStore, MirrorsKV, MirrorSpan, StepMirror
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.model.forward_batch import ForwardBatch

# positions a step mirrors at most beyond its own new ones: a backlog (the running requests' KV
# when mirroring begins, a prefix-cache hit's) goes over several steps, not in one burst
MIRROR_BACKLOG_POSITIONS = 256


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """What a stage needs to know of a sequence that joins (or rejoins after preemption)."""

    num_prompt_tokens: int
    params: SamplingParams
    output_token_ids: tuple[int, ...] = ()
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served when it (re)joined
    latency_budget_ms: float = 0.0  # the request's target time per output token (0 = none)
    carry_key: str = ""  # its request's id: what a re-planned stage's KV of it is kept under

    @property
    def history_len(self) -> int:
        """Tokens it (re)joins with: prompt and output so far."""
        return self.num_prompt_tokens + len(self.output_token_ids)


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
    mirror: StepMirror | None = None  # this step's KV, for the next stage's node (`mirror_kv`)


@dataclass(slots=True)
class _SequenceState:
    params: SamplingParams
    output_token_ids: list[int]
    block_tables: list[list[int]] = field(default_factory=list)  # one per KV group
    key: str = ""  # `SequenceSpec.carry_key`
    length: int = 0  # positions whose KV this stage holds
    carried: RequestCarry | None = None  # its KV from this node's stage before a re-plan
    mirrored: int = 0  # positions whose KV went to the next stage's node (`mirror_kv`)


class Stage:
    """Layers [start, end) behind a backend, with the per-sequence state the step deltas build up.

    With several KV groups (`mohawk_common.kv_groups`, `num_kv_groups` from the model config) a
    step's new block ids come group after group, as many for each."""

    def __init__(
        self,
        backend: Backend,
        block_size: int,
        num_kv_groups: int = 1,
        *,
        num_blocks: int | None = None,
        mirror_max_bytes: int | None = None,
    ) -> None:
        self.backend = backend
        self.block_size = block_size
        self.num_kv_groups = num_kv_groups
        self._sequences: dict[int, _SequenceState] = {}
        self._carriers = carrier_parts(backend) if num_kv_groups == 1 else None
        self._ranges = tuple((p.start, p.end) for p in self._carriers or ())
        # a stage that sends rows on keeps them, slot for slot, for its successor after a re-plan
        keeps_rows = self._carriers is not None and not backend.has_head and num_blocks is not None
        self._num_row_slots = num_blocks * block_size if keeps_rows and num_blocks else 0
        self._row_pool: Any | None = None
        self._carry = Carry()
        mirrorers = self._carriers if all(isinstance(p, MirrorsKV) for p in self._carriers or ()) else None
        self._mirrorers: tuple[Any, ...] | None = mirrorers
        self._mirror_kv = False
        self._mirror_restarts = False
        self._mirrors = KvMirrorStore(mirror_max_bytes)  # what the stage before mirrored here

    @property
    def carries_kv(self) -> bool:
        """Whether this stage hands its KV to its successor when a re-plan stops it."""
        return self._carriers is not None

    def adopt(self, carry: Carry) -> None:
        """Take the KV a stage before a re-plan held, for the requests this one resumes."""
        if self._carriers is not None:
            self._carry.merge(carry)

    @property
    def mirror_kv(self) -> bool:
        """Whether each step's KV goes to the next stage's node, which holds these layers on standby."""
        return self._mirror_kv

    @mirror_kv.setter
    def mirror_kv(self, on: bool) -> None:
        on = on and self._mirrorers is not None
        if on and not self._mirror_kv:  # the holder gets each sequence's KV from position 0
            self._mirror_restarts = True  # (on the compute thread, at the next step)
        self._mirror_kv = on

    def num_carried(self, key: str, history_len: int) -> int:
        """Positions of request `key`'s history of `history_len` tokens whose KV every layer range
        of this stage holds from the stage before a re-plan (not computed here again)."""
        parts = self._carry.requests.get(key) if self._carriers is not None else None
        if not parts:
            return 0
        lengths = [parts[r].length if r in parts else 0 for r in self._ranges]
        return max(0, min(min(lengths), history_len - 1))

    @property
    def num_mirrored(self) -> int:
        """Requests whose KV the stage before mirrored here."""
        return len(self._mirrors)

    def export_carry(self) -> Carry:
        """Copies of the KV (and rows sent on) of every sequence here, by request, per layer range:
        for this node's next stage after a re-plan (call it once no step runs)."""
        carry = Carry()
        if self._carriers is None:
            return carry
        for state in self._sequences.values():
            if not state.key or state.length == 0:
                continue
            parts = {
                r: CarriedPart(p.export_kv(state.block_tables[0], state.length), state.length)
                for r, p in zip(self._ranges, self._carriers, strict=True)
            }
            if self._row_pool is not None:
                last, carrier = self._ranges[-1], self._carriers[-1]
                slots = carrier.slots(state.block_tables[0], 0, state.length)
                rows = carrier.read_rows(self._row_pool, slots)
                parts[last] = CarriedPart(parts[last].kv, state.length, rows, state.length)
            carry.requests[state.key] = parts
        if self._mirrorers is not None:
            for key, parts in self._mirrors.carried(self._mirrorers[-1]).items():
                carry.requests.setdefault(key, {}).update(parts)
        return carry

    @property
    def num_sequences(self) -> int:
        return len(self._sequences)

    def step(
        self, batch: StepBatch, hidden_states: Any | None = None, mirror: StepMirror | None = None
    ) -> StageOutput:
        """Run the step (`hidden_states`: the stage before's rows; `mirror`: its KV of the step,
        mirrored here while this node holds its layers on standby)."""
        for seq_id in batch.freed_seq_ids:
            freed = self._sequences.pop(seq_id, None)
            if freed is not None:
                self._mirrors.drop(freed.key)
        self._carry.expire()
        if not batch.sequences:
            return StageOutput(batch.step_id)
        chunks = []
        more_tables = []
        states = []
        for step in batch.sequences:
            state = self._state_for(step)
            per_group = len(step.new_block_ids) // self.num_kv_groups
            for group, table in enumerate(state.block_tables):
                table.extend(step.new_block_ids[group * per_group : (group + 1) * per_group])
            chunks.append((list(step.token_ids), step.start_position, state.block_tables[0], step.sample))
            more_tables.append(state.block_tables[1:])
            states.append(state)
        group_tables = more_tables if self.num_kv_groups > 1 else ()
        forward = ForwardBatch.build(chunks, self.block_size, group_tables=group_tables)
        if any(state.carried for state in states):
            output = self._forward_carried(batch, states, hidden_states)
        else:
            output = self.backend.forward(forward, hidden_states)
        for step, state in zip(batch.sequences, states, strict=True):
            state.length = step.start_position + step.num_new_tokens
            if state.carried and carry_exhausted(state.carried, state.length):
                state.carried = None
        if mirror is not None:
            self._keep_mirror(mirror)
        sent = self._mirror_out(batch.sequences, states)
        if not self.backend.has_head:
            self._keep_rows(forward, output)
            return StageOutput(batch.step_id, hidden_states=output, mirror=sent)
        return StageOutput(batch.step_id, sampled=self._sample(batch, output), mirror=sent)

    def _mirror_out(self, steps: tuple[SequenceStep, ...], states: list[_SequenceState]) -> StepMirror | None:
        """The KV of this step's sequences not yet sent to the next stage's node (`mirror_kv`)."""
        parts = self._mirrorers
        if not self._mirror_kv or parts is None:
            return None
        if self._mirror_restarts:
            self._mirror_restarts = False
            for state in self._sequences.values():
                state.mirrored = 0
        spans, tables = [], []
        room = max(MIRROR_BACKLOG_POSITIONS, sum(s.num_new_tokens for s in steps))
        for step, state in zip(steps, states, strict=True):
            if state.length > state.mirrored and room > 0:
                end = min(state.length, state.mirrored + room)
                spans.append(MirrorSpan(step.seq_id, state.mirrored, end - state.mirrored))
                tables.append((state.block_tables[0], state.mirrored, end))
                room -= end - state.mirrored
                state.mirrored = end
        if not spans:
            return None
        packed = [part.pack_kv(tables) for part in parts]
        layers = (self.backend.start, self.backend.end)
        return StepMirror(
            layers, tuple(spans), packed[0] if len(packed) == 1 else parts[-1].join_rows(packed)
        )

    def _keep_mirror(self, mirror: StepMirror) -> None:
        """Keep the stage before's KV of this step, by request (it is this node's standby's range)."""
        if self._mirrorers is None:
            return
        pieces = self._mirrorers[-1].split_kv(mirror.packed, [s.num_positions for s in mirror.spans])
        for span, piece in zip(mirror.spans, pieces, strict=True):
            state = self._sequences.get(span.seq_id)
            if state is not None:
                self._mirrors.keep(state.key, mirror.layers, span.from_position, piece, span.num_positions)

    def _state_for(self, step: SequenceStep) -> _SequenceState:
        if step.new_sequence is not None:
            spec = step.new_sequence
            tables: list[list[int]] = [[] for _ in range(self.num_kv_groups)]
            joined = _SequenceState(spec.params, list(spec.output_token_ids), tables, spec.carry_key)
            if self._carriers is not None:
                joined.carried = self._carry.claim(spec.carry_key, spec.history_len)
            self._sequences[step.seq_id] = joined
        state = self._sequences.get(step.seq_id)
        if state is None:
            raise KeyError(f"stage got a step for unknown sequence {step.seq_id}")
        return state

    def _keep_rows(self, forward: ForwardBatch, output: Any) -> None:
        """Write the rows sent on into the row pool, at their KV's slots."""
        if not self._num_row_slots or self._carriers is None:
            return
        carrier = self._carriers[-1]
        if self._row_pool is None:
            self._row_pool = carrier.row_pool(self._num_row_slots, output)
        carrier.write_rows(self._row_pool, forward.slot_mapping, output)

    def _forward_carried(self, batch: StepBatch, states: list[_SequenceState], hidden: Any | None) -> Any:
        """A step in which some sequence resumes with carried KV: each layer range computes only the
        positions `kv_carry.compute_starts` gives it; the KV of the others is copied from the carry
        and the rows the next range (or stage) needs of them are the kept ones."""
        parts = self._carriers
        if parts is None:
            raise RuntimeError("a carry on a stage that cannot carry")
        last_stage = self.backend.has_head
        steps = batch.sequences
        plans = [
            plan_chunk(state.carried, self._ranges, step, last_stage)
            for step, state in zip(steps, states, strict=True)
        ]
        # per sequence, the rows the range before gave (None: none), from position rows_from[i]
        rows: list[Any] | None = None
        if hidden is not None:
            rows = [hidden[lo:hi] for lo, hi in row_spans([p.end - p.start for p in plans])]
        rows_from = [p.start for p in plans]
        output = None
        for index, part in enumerate(parts):
            for state, plan in zip(states, plans, strict=True):
                if plan.starts[index] > plan.start and state.carried:
                    kv = state.carried[self._ranges[index]].kv
                    part.import_kv(kv, state.block_tables[0], plan.start, plan.starts[index])
            inputs = self._rows_for(index, states, plans, rows, rows_from)
            todo = [i for i, plan in enumerate(plans) if plan.starts[index] < plan.end]
            output = self._run_range(
                part,
                index,
                [steps[i] for i in todo],
                [states[i] for i in todo],
                [plans[i] for i in todo],
                None if inputs is None else [inputs[i] for i in todo],
            )
            if index == len(parts) - 1 and last_stage:
                return output
            spans = row_spans([plans[i].end - plans[i].starts[index] for i in todo])
            computed = {i: output[lo:hi] for i, (lo, hi) in zip(todo, spans, strict=True)}
            rows = [computed.get(i) for i in range(len(plans))]
            rows_from = [plan.starts[index] for plan in plans]
        sent = self._rows_for(len(parts), states, plans, rows, rows_from) or []
        return parts[-1].join_rows(sent)

    def _run_range(
        self,
        part: CarriesKV,
        index: int,
        steps: list[SequenceStep],
        states: list[_SequenceState],
        plans: list[ChunkPlan],
        inputs: list[Any] | None,
    ) -> Any:
        """Layer range `index` on the positions it computes of `steps` (None if none)."""
        if not steps:
            return None
        chunks = []
        for step, state, plan in zip(steps, states, plans, strict=True):
            first = plan.starts[index]
            tokens = list(step.token_ids[first - plan.start :])
            chunks.append((tokens, first, state.block_tables[0], plan.sample))
        joined = None if inputs is None else part.join_rows(inputs)
        return part.forward(ForwardBatch.build(chunks, self.block_size), joined)

    def _join_rows(self, rows: list[Any]) -> Any:
        """Rows laid end to end by the stage's array library."""
        if self._carriers is None:
            raise RuntimeError("only a stage that carries KV joins rows")
        return self._carriers[-1].join_rows(rows)

    def _rows_for(
        self,
        index: int,
        states: list[_SequenceState],
        plans: list[ChunkPlan],
        rows: list[Any] | None,
        rows_from: list[int],
    ) -> list[Any] | None:
        """Per sequence, the rows layer range `index` reads (at `len(ranges)`: the rows the stage
        sends on, the whole chunk), from the position it computes from: the range before's computed
        rows, led by the ones it kept where it computed from further on."""
        if rows is None:
            return None
        out = []
        for i, plan in enumerate(plans):
            first = plan.starts[index] if index < len(self._ranges) else plan.start
            have, got = rows_from[i], rows[i]
            if first >= have:
                out.append(got[first - have :] if got is not None else None)
                continue
            layers = self._ranges[index - 1]
            carried = states[i].carried
            kept = carried.get(layers) if carried is not None else None
            if (
                kept is None
                or kept.outputs is None
                or not kept.outputs_from <= first < have <= kept.outputs_end
            ):
                raise RuntimeError(
                    f"rows [{first}, {have}) of layers {layers} were neither kept nor computed"
                )
            lead = kept.outputs[first - kept.outputs_from : have - kept.outputs_from]
            out.append(lead if got is None else self._join_rows([lead, got]))
        return out

    def _sample(self, batch: StepBatch, logits: Any) -> tuple[tuple[int, SampledToken], ...]:
        steps = [s for s in batch.sequences if s.sample]
        if not steps:
            return ()
        states = [self._sequences[s.seq_id] for s in steps]
        tokens = self.backend.sample(logits, [s.params for s in states], [s.output_token_ids for s in states])
        for state, token in zip(states, tokens, strict=True):
            state.output_token_ids.append(token.token_id)
        return tuple((s.seq_id, t) for s, t in zip(steps, tokens, strict=True))
