"""Block manager with KV groups: a sliding group gives blocks back as its window moves on, a full
group keeps them; exact ids, prefix hits through a window, freeing (CPU only)."""

from __future__ import annotations

from mohawk_common.kv_groups import NULL_BLOCK, KVGroup
from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.sequence import Sequence

SLIDING = (KVGroup((0,), window=5),)  # Mistral-style: every layer slides
HYBRID = (KVGroup((1,)), KVGroup((0,), window=5))  # Gemma-2-style: a full and a sliding group


def seq(seq_id: int, tokens: list[int]) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(tokens), SamplingParams())


def decode(bm: BlockManager, s: Sequence, num_steps: int) -> None:
    """Compute the pending tokens, then `num_steps` decode steps of one token each."""
    for _ in range(num_steps):
        s.num_computed_tokens = s.num_tokens
        s.append_token(7)
        assert bm.allocate_slots(s, 1) is not None


def test_sliding_group_gives_back_blocks_behind_its_window() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, groups=SLIDING)
    a = seq(0, list(range(10)))
    assert bm.allocate_slots(a, 10) == [0, 1, 2]
    decode(bm, a, 1)  # next query at 10 reads keys 6..10: block 0 is behind the window
    assert a.block_ids == [NULL_BLOCK, 1, 2]
    assert bm.num_free_blocks == 6 and bm.num_window_freed == 1
    decode(bm, a, 30)  # 41 tokens: its table spans 11 blocks, at most 3 of them live
    assert sum(b != NULL_BLOCK for b in a.block_ids) == 2 and len(a.block_ids) == 11
    assert bm.num_free_blocks == 6
    bm.free(a)
    assert bm.num_free_blocks == 8 and a.block_ids == []


def test_full_group_keeps_every_block_and_new_ids_go_out_group_after_group() -> None:
    bm = BlockManager(num_blocks=16, block_size=4, groups=HYBRID)
    a = seq(0, list(range(10)))
    assert bm.allocate_slots(a, 10) == [0, 1, 2, 3, 4, 5]  # full group's three, then sliding's
    assert a.block_tables == [[0, 1, 2], [3, 4, 5]]
    decode(bm, a, 6)  # position 15 reads keys 11..15: the sliding group gave blocks 3 and 4 back
    assert a.block_tables == [[0, 1, 2, 6], [NULL_BLOCK, NULL_BLOCK, 5, 7]]
    assert bm.num_free_blocks == 16 - 6 and bm.num_window_freed == 2
    bm.free(a)
    assert bm.num_free_blocks == 16 and a.block_tables == [[]]


def test_window_blocks_count_as_room() -> None:
    bm = BlockManager(num_blocks=3, block_size=4, groups=SLIDING)
    a = seq(0, list(range(12)))
    assert bm.allocate_slots(a, 12) == [0, 1, 2]
    a.num_computed_tokens = 12
    a.append_token(1)
    assert bm.can_allocate(a, 1)  # the pool is empty, but blocks 0 and 1 leave the window first
    assert bm.allocate_slots(a, 1) == [0]  # (position 12 reads keys 8..12)
    assert a.block_ids == [NULL_BLOCK, NULL_BLOCK, 2, 0] and bm.num_free_blocks == 1


def test_prefix_hit_through_a_window() -> None:
    bm = BlockManager(num_blocks=16, block_size=4, groups=HYBRID)
    a = seq(0, list(range(13)))
    bm.allocate_slots(a, 13)
    bm.cache_full_blocks(a, 13)
    b = seq(1, list(range(13)))  # the same prompt: 3 full blocks cached in both groups
    hits = bm.get_computed_blocks(b)
    # the next query (position 12) reads keys 8..12: the sliding group needs only its block 2
    assert hits == [0, 1, 2, NULL_BLOCK, NULL_BLOCK, 6]
    assert bm.num_hit_tokens(hits) == 12
    new = bm.allocate_slots(b, 1, hits)
    assert new == [0, 1, 2, 8, NULL_BLOCK, NULL_BLOCK, 6, 9]
    assert b.num_computed_tokens == 12 and b.block_tables == [[0, 1, 2, 8], [NULL_BLOCK, NULL_BLOCK, 6, 9]]


def test_prefix_hit_stops_where_a_window_was_given_back() -> None:
    bm = BlockManager(num_blocks=4, block_size=4, groups=SLIDING)
    a = seq(0, list(range(8)))
    bm.allocate_slots(a, 8)
    bm.cache_full_blocks(a, 8)
    decode(bm, a, 9)  # 17 tokens: blocks 0.. given back and handed out again for newer positions
    b = seq(1, [*range(8), 7, 7, 7, 7, 7, 7, 7, 7, 7])
    hits = bm.get_computed_blocks(b)
    # every cached block of b's prefix that the window at the hit's end needs must still be cached
    num_hits = bm.num_hit_tokens(hits) // 4
    live = [h for h in hits if h != NULL_BLOCK]
    assert all(bm.blocks[h].block_hash is not None for h in live)
    assert num_hits == 0 or hits[num_hits - 1] != NULL_BLOCK


def test_one_full_group_is_the_default() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, groups=(KVGroup((0, 1)),))
    a = seq(0, list(range(9)))
    assert bm.allocate_slots(a, 9) == [0, 1, 2]
    decode(bm, a, 8)
    assert NULL_BLOCK not in a.block_ids and bm.num_window_freed == 0
