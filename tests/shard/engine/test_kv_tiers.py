"""Two-tier KV accounting in the block manager: exact counts of int8 blocks and bytes saved (CPU only)."""

from __future__ import annotations

from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.kv_tiers import KV_RECENT_BLOCKS, TierBytes, num_cold_blocks, num_hot_blocks
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.sequence import Sequence


def seq(seq_id: int, tokens: list[int]) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(tokens), SamplingParams())


def test_rule_keeps_the_newest_full_blocks_and_the_partial_one_hot() -> None:
    assert KV_RECENT_BLOCKS == 2
    assert [num_cold_blocks(n, 4) for n in (0, 8, 11, 12, 15, 16, 21)] == [0, 0, 0, 1, 1, 2, 3]


def test_hot_pool_is_a_fraction_with_a_floor() -> None:
    assert num_hot_blocks(10) == 10
    assert num_hot_blocks(1000) == 128
    assert num_hot_blocks(4000) == 500


def test_tier_bytes_of_smollm2_fp32() -> None:
    tiers = TierBytes.of(30, 3, 64, 16, 4)
    assert tiers.hot == 30 * 2 * 3 * 64 * 16 * 4  # 737,280
    assert tiers.cold == 30 * 2 * 3 * 64 * 16 + 30 * 2 * 3 * 4  # 184,320 + 720
    assert tiers.average == tiers.cold + tiers.hot // 8
    assert tiers.saved == tiers.hot - tiers.cold


def test_counts_blocks_as_sequences_grow() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, int8_saving_per_block=100)
    a = seq(0, list(range(10)))
    bm.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    bm.cache_full_blocks(a, 10)
    assert bm.num_quantized_blocks == 0  # two full blocks, both recent
    for token in range(10, 16):
        a.append_token(token)
        bm.allocate_slots(a, 1)
        a.num_computed_tokens += 1
        bm.cache_full_blocks(a, a.num_computed_tokens)
    assert a.num_computed_tokens == 16 and a.block_ids == [0, 1, 2, 3]
    assert bm.num_quantized_blocks == 2 and bm.bytes_saved == 200
    assert [bm.blocks[i].is_int8 for i in range(4)] == [True, True, False, False]


def test_shared_prefix_blocks_count_once() -> None:
    bm = BlockManager(num_blocks=16, block_size=4, int8_saving_per_block=1)
    prompt = list(range(20))
    a = seq(0, prompt)
    bm.allocate_slots(a, 20)
    a.num_computed_tokens = 20
    bm.cache_full_blocks(a, 20)
    assert bm.num_quantized_blocks == 3
    b = seq(1, [*prompt, 7])
    hits = bm.get_computed_blocks(b)
    assert hits == [0, 1, 2, 3, 4]
    bm.allocate_slots(b, 21 - 20, hits)
    b.num_computed_tokens = 21
    bm.cache_full_blocks(b, 21)
    assert bm.num_quantized_blocks == 3


def test_count_survives_free_and_drops_when_blocks_are_reused() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False, int8_saving_per_block=10)
    a = seq(0, list(range(20)))
    bm.allocate_slots(a, 20)
    a.num_computed_tokens = 20
    bm.cache_full_blocks(a, 20)
    assert bm.num_quantized_blocks == 3  # blocks 0, 1, 2
    bm.free(a)
    assert bm.num_quantized_blocks == 3 and bm.bytes_saved == 30  # int8 data lives on
    b = seq(1, list(range(100, 124)))
    assert bm.allocate_slots(b, 24) == [5, 6, 7, 4, 3, 2]
    assert bm.num_quantized_blocks == 2  # block 2 was handed out for new content


def test_one_tier_counts_nothing() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq(0, list(range(20)))
    bm.allocate_slots(a, 20)
    bm.cache_full_blocks(a, 20)
    assert bm.num_quantized_blocks == 0 and bm.bytes_saved == 0
