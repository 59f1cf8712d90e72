"""`KVTiers` as a plain object on a small cache, no model: the cold rule it is given decides which
blocks go int8 (the rule is passed in, `model/` never imports `engine/`), and a block that went cold
comes back exactly as quantized when it is written again."""

from __future__ import annotations

import torch

from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.kv_cache import Int8Store, KVCache, dequantize, quantize_blocks
from mohawk_shard.model.kv_quant import KVTiers

BLOCK, BLOCKS, HOT, HEADS, DIM = 4, 8, 4, 2, 8


def cache() -> KVCache:
    def pool() -> torch.Tensor:
        return torch.randn(HEADS, HOT * BLOCK, DIM)

    def home() -> Int8Store:
        return Int8Store(
            torch.zeros(BLOCKS * BLOCK, HEADS, DIM, dtype=torch.int8), torch.zeros(BLOCKS, HEADS)
        )

    return KVCache(pool(), pool(), home(), home())


def prefill(tiers: KVTiers, caches: list[KVCache], num_tokens: int) -> ForwardBatch:
    batch = ForwardBatch.build([(list(range(num_tokens)), 0, list(range(BLOCKS)), True)], BLOCK)
    tiers.prepare(batch, caches)
    tiers.settle(batch, caches)
    return batch


def test_the_rule_passed_in_decides_which_blocks_go_cold() -> None:
    for rule, expected in [
        (lambda context_len, block_size: 0, 0),  # nothing cold
        (lambda context_len, block_size: context_len // block_size, 3),  # every full block
        (lambda context_len, block_size: 1, 1),
    ]:
        tiers, caches = KVTiers(BLOCKS, BLOCK, HOT, rule), [cache(), cache()]
        prefill(tiers, caches, 3 * BLOCK + 1)  # 3 full blocks and one started
        assert tiers.num_cold == expected
        assert int((tiers.hot_of >= 0).sum()) == 4 - expected  # a cold block gave its hot block back


def test_a_cold_block_is_restored_as_it_was_quantized() -> None:
    caches = [cache()]
    tiers = KVTiers(BLOCKS, BLOCK, HOT, lambda context_len, block_size: 1)
    batch = ForwardBatch.build([(list(range(2 * BLOCK)), 0, list(range(BLOCKS)), True)], BLOCK)
    tiers.prepare(batch, caches)
    hot = int(tiers.hot_of[0])
    written = caches[0].key[:, hot * BLOCK : (hot + 1) * BLOCK].clone()  # [heads, block, dim]
    tiers.settle(batch, caches)
    assert tiers.is_cold[0] and tiers.hot_of[0] < 0
    quantized, scale = quantize_blocks(written.transpose(0, 1).unsqueeze(0))
    assert torch.equal(caches[0].key_int8.data[:BLOCK], quantized[0])  # type: ignore[union-attr]
    # block 0 handed out again for new content: its int8 home comes back into a hot block
    again = ForwardBatch.build([([7], 0, [0], True)], BLOCK)
    tiers.prepare(again, caches)
    back = int(tiers.hot_of[0])
    restored = caches[0].key[:, back * BLOCK : (back + 1) * BLOCK]
    expected = dequantize(quantized[0], scale[0].expand(BLOCK, -1), torch.float32).transpose(0, 1)
    assert not tiers.is_cold[0] and torch.equal(restored, expected)
