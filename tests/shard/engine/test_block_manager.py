"""Block manager: exact block ids, prefix sharing, freeing and eviction order (CPU only)."""

from __future__ import annotations

from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.sequence import Sequence


def seq(seq_id: int, tokens: list[int]) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(tokens), SamplingParams())


def test_allocates_lowest_free_ids_and_grows_by_block() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq(0, list(range(6)))
    assert bm.allocate_slots(a, 6) == [0, 1]
    a.num_computed_tokens = 6
    a.append_token(99)
    assert bm.allocate_slots(a, 1) == []  # slot 6 fits block 1
    a.num_computed_tokens = 7
    a.append_token(98)
    assert bm.allocate_slots(a, 1) == []  # slot 7 fills block 1
    a.num_computed_tokens = 8
    a.append_token(97)
    assert bm.allocate_slots(a, 1) == [2]
    assert a.block_ids == [0, 1, 2]
    assert bm.num_free_blocks == 5


def test_refuses_when_pool_too_small_and_leaves_state_untouched() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    a = seq(0, list(range(9)))
    assert not bm.can_allocate(a, 9)
    assert bm.allocate_slots(a, 9) is None
    assert a.block_ids == [] and bm.num_free_blocks == 2


def test_free_returns_blocks_at_once() -> None:
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    a = seq(0, list(range(8)))
    bm.allocate_slots(a, 8)
    bm.free(a)
    assert a.block_ids == [] and bm.num_free_blocks == 4
    b = seq(1, list(range(100, 116)))
    # never-used blocks first, then freed ones tail first (a tail block is the least likely to be shared)
    assert bm.allocate_slots(b, 16) == [2, 3, 1, 0]


def test_prefix_shared_between_sequences() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(10))  # two full blocks + 2 tokens
    a = seq(0, prompt)
    assert bm.allocate_slots(a, 10) == [0, 1, 2]
    a.num_computed_tokens = 10
    bm.cache_full_blocks(a, 10)
    b = seq(1, [*prompt[:8], 50, 51, 52])
    hits = bm.get_computed_blocks(b)
    assert hits == [0, 1]
    assert bm.allocate_slots(b, 3, hits) == [0, 1, 3]
    assert b.num_computed_tokens == 8 and b.num_cached_tokens == 8
    assert bm.blocks[0].ref_count == 2 and bm.blocks[1].ref_count == 2 and bm.blocks[3].ref_count == 1
    bm.free(a)
    assert bm.blocks[0].ref_count == 1 and bm.num_free_blocks == 8 - 3  # block 2 back; 0,1,3 held by b


def test_prefix_hit_never_covers_the_whole_prompt() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq(0, list(range(8)))
    bm.allocate_slots(a, 8)
    bm.cache_full_blocks(a, 8)
    same = seq(1, list(range(8)))
    assert bm.get_computed_blocks(same) == [0]  # the last token must be computed to get logits


def test_different_earlier_block_means_no_hit() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq(0, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate_slots(a, 9)
    bm.cache_full_blocks(a, 9)
    b = seq(1, [0, 2, 3, 4, 5, 6, 7, 8, 9])  # same second block, different first
    assert bm.get_computed_blocks(b) == []


def test_freed_cached_block_is_revived_then_evicted_lru() -> None:
    bm = BlockManager(num_blocks=3, block_size=2)
    a = seq(0, [1, 2, 3, 4, 5])
    assert bm.allocate_slots(a, 5) == [0, 1, 2]
    bm.cache_full_blocks(a, 5)
    bm.free(a)  # all free, blocks 0 and 1 keep their hashes
    b = seq(1, [1, 2, 3, 4, 7])
    hits = bm.get_computed_blocks(b)
    assert hits == [0, 1]
    assert bm.allocate_slots(b, 1, hits) == [0, 1, 2]
    bm.free(b)
    c = seq(2, [9, 9, 9, 9, 9, 9])  # new content takes blocks in freed order: 2, 1, 0 and drops their hashes
    assert bm.allocate_slots(c, 6) == [2, 1, 0]
    assert bm.get_computed_blocks(seq(3, [1, 2, 3, 4, 5])) == []


def test_revived_blocks_count_against_free_space() -> None:
    bm = BlockManager(num_blocks=2, block_size=2)
    a = seq(0, [1, 2, 3])
    bm.allocate_slots(a, 3)
    bm.cache_full_blocks(a, 3)
    bm.free(a)
    b = seq(1, [1, 2, 3, 4, 5, 6])
    hits = bm.get_computed_blocks(b)
    assert hits == [0]
    assert bm.allocate_slots(b, 4, hits) is None  # needs block 0 revived plus 2 new: only 2 exist
    assert bm.num_free_blocks == 2
