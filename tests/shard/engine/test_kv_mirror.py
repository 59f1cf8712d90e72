"""A stage whose layers the next stage's node holds on standby mirrors its KV there each step, so
the widened stage that takes them over after a failover computes nothing of what they had
computed, and every token comes out as the undisturbed pipeline gave it (real tiny torch stages,
the default mode, greedy). The harness is test_kv_carry's."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from mohawk_common.model_store import ModelSource
from mohawk_shard.backends.stacked import StackedBackend
from mohawk_shard.engine import stage as stage_module
from mohawk_shard.engine.kv_mirror import KvMirrorStore
from mohawk_shard.engine.stage import Stage, StepBatch
from tests.shard.engine import test_architectures as architectures
from tests.shard.engine.test_kv_carry import (
    BEFORE_KILL,
    BLOCK,
    NUM_BLOCKS,
    PROMPTS,
    TOTAL,
    Counted,
    Pipeline,
    backend,
    fresh_runs,
    reference,
    resumed,
)


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> ModelSource:
    return architectures.tiny_source(tmp_path_factory)


@pytest.mark.parametrize("mirror", [True, False], ids=["mirrored", "not-mirrored"])
def test_the_holder_of_a_mirrored_range_takes_it_over_computing_only_the_last_position(
    tiny_source: ModelSource, mirror: bool
) -> None:
    cuts = (0, 1, 2, tiny_source.config.num_layers)
    expected = reference(tiny_source, cuts)
    first, middle, last = (backend(tiny_source, a, b) for a, b in itertools.pairwise(cuts))
    old = [Stage(b, BLOCK, num_blocks=NUM_BLOCKS) for b in (first, middle, last)]
    runs = fresh_runs(0)
    pipeline = Pipeline(old, 0)
    pipeline.run(runs, 2)
    old[1].mirror_kv = mirror  # turned on mid-answer: the holder gets each request's KV from 0
    pipeline.run(runs, BEFORE_KILL)
    assert old[2].num_mirrored == (len(PROMPTS) if mirror else 0)
    carried = {0: old[0].export_carry(), 2: old[2].export_carry()}  # the middle node died
    mirrored = {key: parts.get((1, 2)) for key, parts in carried[2].requests.items()}
    if mirror:  # the holder's copy is the dead stage's KV, bit for bit
        for key, part in mirrored.items():
            assert part is not None
            run = runs[list(PROMPTS).index(key)]
            dead = old[1]._sequences[run.seq_id]  # what died with the node
            own = middle.export_kv(dead.block_tables[0], part.length)
            assert all(
                torch.equal(a, b)
                for x, y in zip(part.kv, own, strict=True)
                for a, b in zip(x, y, strict=True)
            )
    else:
        assert not any(mirrored.values())
    for survivor in (first, last):
        survivor.allocate_kv_cache(NUM_BLOCKS, BLOCK)
    standby, own_first, own_last = Counted(backend(tiny_source, 1, 2)), Counted(first), Counted(last)
    new = [
        Stage(own_first, BLOCK, num_blocks=NUM_BLOCKS),
        Stage(StackedBackend([standby, own_last]), BLOCK, num_blocks=NUM_BLOCKS),
    ]
    new[0].adopt(carried[0])
    new[1].adopt(carried[2])
    runs = resumed(runs, 100)
    history = sum(len(r.tokens) for r in runs)
    for run, key in zip(runs, PROMPTS, strict=True):  # what stage 0's scheduler is told is carried
        assert new[0].num_carried(key, len(run.tokens)) == len(run.tokens) - 1
        assert new[1].num_carried(key, len(run.tokens)) == (len(run.tokens) - 1 if mirror else 0)
    resume = Pipeline(new, 7)
    resume.run(runs, BEFORE_KILL)
    assert [r.tokens for r in runs] == [e[: len(r.tokens)] for r, e in zip(runs, expected, strict=True)]
    assert own_first.rows == own_last.rows == len(runs)
    assert standby.rows == (len(runs) if mirror else history)
    resume.run(runs, TOTAL)
    assert [r.tokens for r in runs] == expected


def test_a_freed_request_leaves_the_holder(tiny_source: ModelSource) -> None:
    layers = tiny_source.config.num_layers
    stages = [Stage(backend(tiny_source, 0, 1), BLOCK), Stage(backend(tiny_source, 1, layers), BLOCK)]
    stages[0].mirror_kv = True
    runs = fresh_runs(0)
    pipeline = Pipeline(stages, 0)
    pipeline.run(runs, 2)
    assert stages[1].num_mirrored == len(runs)
    stages[1].step(StepBatch(99, (), freed_seq_ids=(runs[0].seq_id,)))
    assert stages[1].num_mirrored == len(runs) - 1
    assert set(stages[1].export_carry().requests[list(PROMPTS)[1]]) == {(0, 1), (1, layers)}


def test_a_mirror_with_a_hole_is_dropped_and_one_from_zero_starts_again() -> None:
    store = KvMirrorStore()
    store.keep("req", (0, 2), 0, "a", 5)
    store.keep("req", (0, 2), 5, "b", 1)
    assert len(store) == 1
    store.keep("req", (0, 2), 7, "c", 1)  # position 6 never came: the copy is no use
    assert len(store) == 0
    store.keep("req", (0, 2), 3, "d", 1)  # nothing held and not from 0: nothing kept
    assert len(store) == 0
    store.keep("req", (0, 2), 0, "e", 2)
    store.keep("req", (0, 2), 0, "f", 3)  # a rejoin: from 0 again
    assert len(store) == 1
    store.drop("req")
    assert len(store) == 0


def test_a_backlog_is_mirrored_over_several_steps(tiny_source: ModelSource) -> None:
    """Mirroring turned on under running requests sends their KV from position 0 at most
    `MIRROR_BACKLOG_POSITIONS` (beyond the step's own positions) a step; the holder's copy is
    whole once it caught up."""
    layers = tiny_source.config.num_layers
    stages = [Stage(backend(tiny_source, 0, 1), BLOCK), Stage(backend(tiny_source, 1, layers), BLOCK)]
    runs = fresh_runs(0)
    pipeline = Pipeline(stages, 0)
    pipeline.run(runs, 3)
    stage_module.MIRROR_BACKLOG_POSITIONS = 6
    try:
        stages[0].mirror_kv = True
        sent: list[int] = []
        step = stages[0].step

        def counted(*args: Any) -> Any:
            out = step(*args)
            sent.append(sum(s.num_positions for s in out.mirror.spans) if out.mirror else 0)
            return out

        stages[0].step = counted  # type: ignore[method-assign]
        pipeline.run(runs, 11)
    finally:
        stage_module.MIRROR_BACKLOG_POSITIONS = 256
    assert sent[0] == 6 and max(sent) == 6  # 20 positions behind, 2 new a step: 6 a step
    lengths = {key: p[(0, 1)].length for key, p in stages[1].export_carry().requests.items()}
    assert lengths == {key: len(r.tokens) - 1 for key, r in zip(PROMPTS, runs, strict=True)}


class Piece:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def test_the_holder_keeps_at_most_its_limit_and_refuses_the_request_past_it() -> None:
    store = KvMirrorStore(max_bytes=100)
    store.keep("a", (0, 2), 0, Piece(60), 6)
    store.keep("b", (0, 2), 0, Piece(30), 3)
    assert (len(store), store.nbytes) == (2, 90)
    store.keep("a", (0, 2), 6, Piece(20), 2)  # past the limit: a is no longer kept at all
    assert (len(store), store.nbytes, store.num_refused) == (1, 30, 1)
    store.keep("a", (0, 2), 8, Piece(1), 1)  # and its later pieces have a hole
    assert len(store) == 1
    store.drop("b")
    assert (len(store), store.nbytes) == (0, 0)
