"""A re-planned stage resumes from the KV its node held: a failover recomputes only the dead node's
layers, and every token comes out as the undisturbed pipeline gave it (real tiny torch stages, the
default mode, greedy).

The pipelines here are `Stage`s called one after another, as the in-process engine does; the step
messages are what stage 0's scheduler would send: each request's first step carries its spec, a
resumed request joins the new pipeline under a new sequence id with new blocks and is prefilled in
chunks from prompt and output so far."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from mohawk_common.model_store import ModelSource
from mohawk_shard.backends import make_backend
from mohawk_shard.backends.stacked import StackedBackend
from mohawk_shard.engine.kv_carry import CarriedPart, Carry, compute_starts
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.stage import SequenceSpec, SequenceStep, Stage, StepBatch
from tests.shard.engine import test_architectures as architectures

BLOCK = 4
NUM_BLOCKS = 64
PROMPTS = {"req-a": [5, 200, 17, 40, 33, 2, 77, 9, 12], "req-b": [8, 300, 41, 6, 90]}
BEFORE_KILL, TOTAL = 6, 12  # tokens emitted before the re-plan, and in all
CHUNK = 4  # the resume's prefill runs in chunks of this many tokens


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> ModelSource:
    return architectures.tiny_source(tmp_path_factory)


class Counted:
    """A torch backend that counts the token rows it computes."""

    def __init__(self, backend: Any) -> None:
        self.inner = backend
        self.rows = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, batch: Any, hidden: Any) -> Any:
        self.rows += batch.num_tokens
        return self.inner.forward(batch, hidden)


def backend(source: ModelSource, start: int, end: int) -> Any:
    made = make_backend("torch", source, start, end, device="cpu")
    made.allocate_kv_cache(NUM_BLOCKS, BLOCK)
    return made


@dataclass
class Running:
    seq_id: int
    tokens: list[int]  # prompt and output so far
    num_prompt: int
    computed: int = 0
    blocks: list[int] = field(default_factory=list)


class Pipeline:
    """Stages called in order, fed what stage 0's scheduler would send, greedy sampling."""

    def __init__(self, stages: list[Stage], first_block: int) -> None:
        self.stages = stages
        self.next_block = first_block
        self.step_id = 0

    def _step(self, items: list[tuple[Running, int, bool]]) -> dict[int, int]:
        steps = []
        for run, count, joins in items:
            start = run.computed
            needed = -(-(start + count) // BLOCK) - len(run.blocks)
            new = list(range(self.next_block, self.next_block + needed))
            self.next_block += needed
            run.blocks += new
            spec = None
            if joins:
                params = SamplingParams.create(temperature=0.0)
                output = tuple(run.tokens[run.num_prompt :])
                key = next(k for k, p in PROMPTS.items() if p == run.tokens[: run.num_prompt])
                spec = SequenceSpec(run.num_prompt, params, output, carry_key=key)
            tokens = tuple(run.tokens[start : start + count])
            last = start + count == len(run.tokens)
            steps.append(SequenceStep(run.seq_id, start, tokens, tuple(new), last, spec))
            run.computed += count
        self.step_id += 1
        hidden = mirror = None
        batch = StepBatch(self.step_id, tuple(steps))
        for stage in self.stages[:-1]:
            out = stage.step(batch, hidden, mirror)
            hidden, mirror = out.hidden_states, out.mirror
        sampled = self.stages[-1].step(batch, hidden, mirror).sampled
        return {seq_id: token.token_id for seq_id, token in sampled}

    def run(self, runs: list[Running], until: int) -> None:
        """Prefill every run not computed yet in chunks (its last chunk samples), then decode them
        all together until each has `until` outputs."""
        joined = {r.seq_id: r.computed > 0 for r in runs}
        while True:
            prefilling = [r for r in runs if not joined[r.seq_id] or len(r.tokens) - r.computed > 1]
            if not prefilling and min(len(r.tokens) - r.num_prompt for r in runs) >= until:
                return
            step_runs = prefilling or runs
            items = [(r, min(CHUNK, len(r.tokens) - r.computed), not joined[r.seq_id]) for r in step_runs]
            for r in step_runs:
                joined[r.seq_id] = True
            self._append(runs, self._step(items))

    @staticmethod
    def _append(runs: list[Running], sampled: dict[int, int]) -> None:
        for r in runs:
            if r.seq_id in sampled:
                r.tokens.append(sampled[r.seq_id])


def fresh_runs(first_id: int) -> list[Running]:
    return [Running(first_id + i, list(p), len(p)) for i, p in enumerate(PROMPTS.values())]


def resumed(runs: list[Running], first_id: int) -> list[Running]:
    """The runs as a new stage 0 takes them back: the tokens seen so far, nothing computed."""
    return [Running(first_id + i, list(r.tokens), r.num_prompt) for i, r in enumerate(runs)]


def reference(source: ModelSource, cuts: tuple[int, ...]) -> list[list[int]]:
    stages = [Stage(backend(source, a, b), BLOCK, num_blocks=NUM_BLOCKS) for a, b in itertools.pairwise(cuts)]
    runs = fresh_runs(0)
    Pipeline(stages, 0).run(runs, TOTAL)
    return [r.tokens for r in runs]


def test_compute_starts_walks_back_from_what_the_stage_must_output() -> None:
    # held per range: (KV length, kept rows' positions [lo, hi))
    # nothing carried: every range computes the whole chunk
    assert compute_starts([(0, 0, 0), (0, 0, 0)], 4, 8, 4) == (4, 4)
    # all carried, rows kept at the stage's end: only what must be output below them is computed
    assert compute_starts([(20, 0, 0), (20, 0, 20)], 4, 8, 4) == (8, 8)
    # the last range's KV died: it computes all; the range before gives every row it needs
    assert compute_starts([(20, 0, 0), (0, 0, 0)], 4, 8, 4) == (4, 4)
    # the first range kept its rows: it computes nothing of this chunk, the second all of it
    assert compute_starts([(20, 0, 20), (0, 0, 0)], 4, 8, 4) == (8, 4)
    # a last stage sampling row 7 computes that row only
    assert compute_starts([(20, 0, 0)], 4, 8, 7) == (7,)
    # KV carried but the rows needed were not kept: computed again from the first row needed
    assert compute_starts([(20, 0, 5), (0, 0, 0)], 0, 8, 0) == (5, 0)
    assert compute_starts([(20, 0, 2), (3, 0, 0)], 0, 8, 0) == (2, 0)
    # rows kept from where a prefix-cache hit let the sequence join (6): below it, computed
    assert compute_starts([(20, 6, 20)], 4, 8, 4) == (4,)
    assert compute_starts([(20, 6, 20)], 8, 12, 8) == (12,)


@pytest.mark.parametrize("layout", ["middle-dies", "first-widens", "last-widens"])
def test_a_resume_computes_only_the_dead_range_and_gives_the_same_tokens(
    tiny_source: ModelSource, layout: str
) -> None:
    layers = tiny_source.config.num_layers
    cuts = (0, 1, 2, layers)
    expected = reference(tiny_source, cuts)
    first, middle, last = (backend(tiny_source, a, b) for a, b in itertools.pairwise(cuts))
    old = [Stage(b, BLOCK, num_blocks=NUM_BLOCKS) for b in (first, middle, last)]
    runs = fresh_runs(0)
    Pipeline(old, 0).run(runs, BEFORE_KILL)
    carried = {0: old[0].export_carry(), 2: old[2].export_carry()}  # the middle node died
    assert set(carried[0].requests) == set(PROMPTS) == set(carried[2].requests)
    for survivor in (first, last):
        survivor.allocate_kv_cache(NUM_BLOCKS, BLOCK)  # the new epoch's pool
    standby = Counted(backend(tiny_source, 1, 2))
    own_first, own_last = Counted(first), Counted(last)
    if layout == "middle-dies":
        new = [
            Stage(own_first, BLOCK, num_blocks=NUM_BLOCKS),
            Stage(standby, BLOCK, num_blocks=NUM_BLOCKS),
            Stage(own_last, BLOCK, num_blocks=NUM_BLOCKS),
        ]
        adopted = {0: 0, 2: 2}
    elif layout == "first-widens":
        new = [
            Stage(StackedBackend([own_first, standby]), BLOCK, num_blocks=NUM_BLOCKS),
            Stage(own_last, BLOCK, num_blocks=NUM_BLOCKS),
        ]
        adopted = {0: 0, 2: 1}
    else:
        new = [
            Stage(own_first, BLOCK, num_blocks=NUM_BLOCKS),
            Stage(StackedBackend([standby, own_last]), BLOCK, num_blocks=NUM_BLOCKS),
        ]
        adopted = {0: 0, 2: 1}
    for old_index, new_index in adopted.items():
        new[new_index].adopt(carried[old_index])
    runs = resumed(runs, 100)
    history = sum(len(r.tokens) for r in runs)
    pipeline = Pipeline(new, 7)  # the new stage 0 hands out other blocks
    pipeline.run(runs, BEFORE_KILL)  # the resume's prefill, which samples the next token
    assert [r.tokens for r in runs] == [e[: len(r.tokens)] for r, e in zip(runs, expected, strict=True)]
    assert standby.rows == history  # the dead range: every position
    assert own_first.rows == own_last.rows == len(runs)  # survivors: each history's last position
    pipeline.run(runs, TOTAL)
    assert [r.tokens for r in runs] == expected


def test_a_carry_is_claimed_once_and_trimmed_to_the_resumed_history() -> None:
    part = CarriedPart(kv="kv", length=10, outputs="rows", num_outputs=10)
    carry = Carry({"req": {(0, 2): part}})
    assert carry.claim("other", 8) is None
    got = carry.claim("req", 8)
    assert got is not None and got[(0, 2)].length == 7 and got[(0, 2)].num_outputs == 7
    assert carry.claim("req", 8) is None  # claimed: gone
    assert Carry({"req": {(0, 2): part}}, expires_at=0.0).claim("req", 8) is None  # expired


def test_a_stage_that_sends_rows_on_keeps_them_beside_its_kv(tiny_source: ModelSource) -> None:
    layers = tiny_source.config.num_layers
    for num_blocks in (None, NUM_BLOCKS):  # without a block count, no rows are kept: KV only
        first = Stage(backend(tiny_source, 0, 1), BLOCK, num_blocks=num_blocks)
        runs = fresh_runs(0)
        Pipeline([first, Stage(backend(tiny_source, 1, layers), BLOCK)], 0).run(runs, 2)
        for key, parts in first.export_carry().requests.items():
            carried = parts[(0, 1)]
            assert carried.length == len(PROMPTS[key]) + 1  # prompt and the first output
            if num_blocks is None:
                assert carried.outputs is None
            else:
                assert isinstance(carried.outputs, torch.Tensor)
                assert (carried.outputs_from, carried.outputs_end) == (0, carried.length)


def test_rows_of_a_prefix_cache_hit_are_carried_too(tiny_source: ModelSource) -> None:
    """A sequence that joined on blocks another computed (a prefix-cache hit) hands on their rows."""
    layers = tiny_source.config.num_layers
    first = Stage(backend(tiny_source, 0, 1), BLOCK, num_blocks=NUM_BLOCKS)
    rest = Stage(backend(tiny_source, 1, layers), BLOCK)
    params = SamplingParams.create(temperature=0.0)
    prompt = PROMPTS["req-a"]  # 9 tokens: two full blocks, then one
    whole = StepBatch(
        1, (SequenceStep(1, 0, tuple(prompt), (0, 1, 2), True, SequenceSpec(9, params, carry_key="req-a")),)
    )
    rest.step(whole, first.step(whole).hidden_states)
    # req-b shares req-a's first two blocks (8 tokens) and joins at position 8
    spec = SequenceSpec(9, params, carry_key="req-b")
    hit = StepBatch(2, (SequenceStep(2, 8, (prompt[8],), (0, 1, 3), True, spec),))
    rest.step(hit, first.step(hit).hidden_states)
    carry = first.export_carry().requests
    shared = carry["req-a"][(0, 1)].outputs[:8]
    assert carry["req-b"][(0, 1)].outputs_from == 0 and torch.equal(
        carry["req-b"][(0, 1)].outputs[:8], shared
    )
