"""Where each KV block lives when the cache has two tiers. The rule that makes a block cold
(`engine/kv_tiers.py`, shared with the block manager, which counts) is passed in as `cold_rule`;
the cache and its int8 store are `kv_cache.py`'s.

Design. Block ids from the block manager are logical. Each has an int8 home (slot `id × block_size +
offset` of the int8 tensors, one fp32 scale per block and KV head) and, while it is recent, a
borrowed block of the smaller hot pool (`hot_of[id]`). A step's writes always land in the
hot pool: a block written for the first time borrows a free hot block, and a cold block written
again (only when it is reused for new content, or after an eviction) is dequantized back first. After
the step, blocks the rule makes cold are quantized (absmax per block and KV head, symmetric, 127
levels) and give their hot block back. Should the hot pool still run dry, the least recently used
hot block not written this step is quantized early (blocks of finished sequences go first); data
is never dropped. Attention reads the hot pool where it can and dequantizes the rest on gather.
All bookkeeping is numpy, once per step for all layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.kv_cache import Int8Store, KVCache, dequantize, quantize_blocks

ColdRule = Callable[[int, int], int]  # (context_len, block_size) -> how many leading blocks are int8


@dataclass(frozen=True, slots=True)
class TierPlan:
    """Per-step slots with hot blocks mapped to the hot pool (numpy; `AttentionMetadata` uploads it).

    `context_slots` are hot-pool slots ([num_seqs, max_context_len], 0 where cold or past the end);
    where some context is cold, `cold_index` (flat positions), `cold_slots` (int8 slots) and
    `cold_blocks` (for the scales) name it, and `hot_index` the positions read from the hot pool.
    """

    slot_mapping: np.ndarray
    context_slots: np.ndarray
    cold_index: np.ndarray | None = None
    cold_slots: np.ndarray | None = None
    cold_blocks: np.ndarray | None = None
    hot_index: np.ndarray | None = None


class KVTiers:
    """Which logical blocks hold a hot block, and which are int8, for one stage's layers."""

    def __init__(self, num_blocks: int, block_size: int, num_hot: int, cold_rule: ColdRule) -> None:
        self.block_size = block_size
        self.cold_rule = cold_rule
        self.num_hot = num_hot
        self.hot_of = np.full(num_blocks, -1, dtype=np.int64)
        self.is_cold = np.zeros(num_blocks, dtype=bool)
        self.owner = np.full(num_hot, -1, dtype=np.int64)
        self.last_used = np.zeros(num_hot, dtype=np.int64)
        self.step = 0

    @property
    def num_cold(self) -> int:
        return int(self.is_cold.sum())

    def prepare(self, batch: ForwardBatch, caches: Sequence[KVCache]) -> TierPlan:
        """Give every block this step writes a hot block, then map the step's slots."""
        self.step += 1
        bs = self.block_size
        written = np.unique(batch.slot_mapping // bs)
        for block_id in written[self.hot_of[written] < 0]:
            hot = self._borrow(written, caches)
            if self.is_cold[block_id]:
                for pool, home in _tiers(caches):
                    _restore(pool, home, int(block_id), hot, bs)
                self.is_cold[block_id] = False
            self.hot_of[block_id], self.owner[hot] = hot, block_id
        logical = batch.context_slots()
        blocks = logical // bs
        hot_blocks = self.hot_of[blocks]
        self.last_used[np.unique(hot_blocks[hot_blocks >= 0])] = self.step
        slot_mapping = self.hot_of[batch.slot_mapping // bs] * bs + batch.slot_mapping % bs
        is_hot = hot_blocks >= 0
        context = np.where(is_hot, hot_blocks * bs + logical % bs, 0)
        if is_hot.all():
            return TierPlan(slot_mapping, context)
        flat_hot, flat_logical = is_hot.reshape(-1), logical.reshape(-1)
        (cold_index,) = np.nonzero(~flat_hot)
        (hot_index,) = np.nonzero(flat_hot)
        cold_slots = flat_logical[cold_index]
        return TierPlan(slot_mapping, context, cold_index, cold_slots, cold_slots // bs, hot_index)

    def settle(self, batch: ForwardBatch, caches: Sequence[KVCache]) -> None:
        """Quantize the hot blocks that the rule made cold in this step."""
        cold: list[np.ndarray] = []
        for row in range(batch.num_seqs):
            num_cold = self.cold_rule(int(batch.context_lens[row]), self.block_size)
            cold.append(batch.block_tables[row, :num_cold])
        if cold:
            blocks = np.unique(np.concatenate(cold))
            self._freeze(blocks[self.hot_of[blocks] >= 0], caches)

    def _borrow(self, written: np.ndarray, caches: Sequence[KVCache]) -> int:
        free = np.flatnonzero(self.owner < 0)
        if free.size:
            return int(free[0])
        candidates = np.flatnonzero(~np.isin(self.owner, written))
        if not candidates.size:
            raise RuntimeError(f"one step writes more KV blocks than the {self.num_hot}-block hot tier holds")
        victim = int(candidates[np.argmin(self.last_used[candidates])])
        self._freeze(self.owner[victim : victim + 1].copy(), caches)
        return victim

    def _freeze(self, blocks: np.ndarray, caches: Sequence[KVCache]) -> None:
        if not blocks.size:
            return
        hot = self.hot_of[blocks]
        device = caches[0].key.device
        hot_t = torch.from_numpy(hot).to(device)
        blocks_t = torch.from_numpy(np.ascontiguousarray(blocks)).to(device)
        for pool, home in _tiers(caches):
            _store(pool, home, hot_t, blocks_t, self.block_size)
        self.is_cold[blocks] = True
        self.owner[hot] = -1
        self.hot_of[blocks] = -1


def _tiers(caches: Sequence[KVCache]) -> list[tuple[torch.Tensor, Int8Store]]:
    pairs = []
    for cache in caches:
        if cache.key_int8 is None or cache.value_int8 is None:
            raise RuntimeError("a two-tier KV step on a cache without its int8 tier")
        pairs += [(cache.key, cache.key_int8), (cache.value, cache.value_int8)]
    return pairs


def _store(
    pool: torch.Tensor, home: Int8Store, hot: torch.Tensor, blocks: torch.Tensor, block_size: int
) -> None:
    kv_heads, _, head_dim = pool.shape  # head-major pool [kv_heads, slots, dim]
    by_block = pool.view(kv_heads, -1, block_size, head_dim).index_select(1, hot).permute(1, 2, 0, 3)
    quantized, scale = quantize_blocks(by_block)
    home.data.view(-1, block_size, kv_heads, head_dim).index_copy_(0, blocks, quantized)
    home.scale.index_copy_(0, blocks, scale)


def _restore(pool: torch.Tensor, home: Int8Store, block_id: int, hot: int, block_size: int) -> None:
    rows = slice(block_id * block_size, (block_id + 1) * block_size)
    pool[:, hot * block_size : (hot + 1) * block_size] = dequantize(
        home.data[rows], home.scale[block_id].expand(block_size, -1), pool.dtype
    ).transpose(0, 1)
