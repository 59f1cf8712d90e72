"""Paged KV cache bookkeeping: which fixed-size blocks each sequence owns.

Design. The KV cache of every stage is one pool of `num_blocks` blocks of `block_size` token slots;
a sequence owns an ordered block table, and token `p` of it lives in slot
`block_ids[p // block_size] * block_size + p % block_size`. Every stage of a pipeline holds a pool
of the same size and receives the same block ids from stage 0, so this bookkeeping happens once.
Blocks are reference counted. A block that becomes full is named by a hash chained over its tokens
and every token before it (SHA-256 of the parent's digest and this block's token ids), so two
sequences with a common prompt prefix share the prefix's blocks and compute them once. A block whose
count drops to zero joins the free queue but keeps its hash: it is reused by a later prefix hit, and
its hash is forgotten only when the block is handed out for new content (least recently freed first).
With an int8 KV tier (`kv_tiers.py`) the same place counts the blocks the tier rule has made int8:
a block is counted once its sequence's computed tokens pass the rule's line, stays counted while its
int8 data lives on (also free, as a prefix-cache entry), and leaves the count when handed out anew.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from mohawk_shard.engine.kv_tiers import num_cold_blocks
from mohawk_shard.engine.sequence import Sequence

_ROOT_DIGEST = b"mohawk.kv.v1"


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    is_int8: bool = False


def hash_block(parent_hash: bytes | None, token_ids: list[int]) -> bytes:
    """Digest naming a full block by its tokens and the tokens of every block before it."""
    digest = hashlib.sha256(parent_hash or _ROOT_DIGEST)
    digest.update(b",".join(str(t).encode() for t in token_ids))
    return digest.digest()


class BlockManager:
    """Free list, reference counts and the prefix cache of one KV pool."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        int8_saving_per_block: int | None = None,
    ) -> None:
        """`int8_saving_per_block`: bytes a block saves once int8 (two-tier KV); None = one tier."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError("a KV pool needs at least one block of at least one slot")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.int8_saving_per_block = int8_saving_per_block
        self.num_quantized_blocks = 0
        self._seq_num_int8: dict[int, int] = {}
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[bytes, int] = {}
        self._seq_hashes: dict[int, list[bytes]] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def bytes_saved(self) -> int:
        """KV bytes the int8 tier saves now, against holding the same blocks in the compute dtype."""
        return self.num_quantized_blocks * (self.int8_saving_per_block or 0)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Ids of cached blocks that hold a prefix of `seq` (at least one token is left to compute)."""
        if not self.enable_prefix_caching or seq.block_ids:
            return []
        num_full = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        parent: bytes | None = None
        for index in range(num_full):
            parent = hash_block(parent, self._block_tokens(seq, index))
            block_id = self._cached.get(parent)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def can_allocate(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> bool:
        return self._num_missing_blocks(seq, num_new_tokens, computed_blocks or []) is not None

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> list[int] | None:
        """Give `seq` room for its next `num_new_tokens`; returns the block ids appended to its table.

        `computed_blocks` (from `get_computed_blocks`, only for a sequence without blocks) are shared
        and advance `seq.num_computed_tokens`. `None` means the pool is too full: preempt or wait.
        """
        computed_blocks = computed_blocks or []
        needed = self._num_missing_blocks(seq, num_new_tokens, computed_blocks)
        if needed is None:
            return None
        for block_id in computed_blocks:
            self._take(block_id)
        if computed_blocks:
            seq.num_cached_tokens = len(computed_blocks) * self.block_size
            seq.num_computed_tokens = seq.num_cached_tokens
            self._seq_hashes[seq.seq_id] = [self._hash_of(b) for b in computed_blocks]
        new_ids = list(computed_blocks)
        for _ in range(needed):
            block_id = next(iter(self._free))
            self._forget_hash(block_id)
            self._forget_int8(block_id)
            self._take(block_id)
            new_ids.append(block_id)
        seq.block_ids.extend(new_ids)
        return new_ids

    def cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Name the blocks of `seq` that `num_tokens` computed tokens fill, so later prompts reuse them
        (and count those the int8 tier now holds)."""
        self._count_int8(seq, num_tokens)
        if not self.enable_prefix_caching:
            return
        hashes = self._seq_hashes.setdefault(seq.seq_id, [])
        num_full = min(num_tokens, seq.num_tokens) // self.block_size
        for index in range(len(hashes), num_full):
            parent = hashes[-1] if hashes else None
            block_hash = hash_block(parent, self._block_tokens(seq, index))
            hashes.append(block_hash)
            block = self.blocks[seq.block_ids[index]]
            if block_hash not in self._cached and block.block_hash is None:
                block.block_hash = block_hash
                self._cached[block_hash] = block.block_id

    def free(self, seq: Sequence) -> None:
        """Release every block of `seq` at once; shared blocks stay with their other owners."""
        for block_id in reversed(seq.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        seq.block_ids.clear()
        seq.num_cached_tokens = 0
        self._seq_hashes.pop(seq.seq_id, None)
        self._seq_num_int8.pop(seq.seq_id, None)

    def _count_int8(self, seq: Sequence, num_tokens: int) -> None:
        if self.int8_saving_per_block is None:
            return
        start = self._seq_num_int8.get(seq.seq_id, 0)
        end = num_cold_blocks(num_tokens, self.block_size)
        for block_id in seq.block_ids[start:end]:
            block = self.blocks[block_id]
            if not block.is_int8:
                block.is_int8 = True
                self.num_quantized_blocks += 1
        self._seq_num_int8[seq.seq_id] = max(start, end)

    def _num_missing_blocks(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int]
    ) -> int | None:
        num_cached_tokens = len(computed_blocks) * self.block_size
        num_computed = max(seq.num_computed_tokens, num_cached_tokens)
        total = self.num_blocks_for(num_computed + num_new_tokens)
        needed = max(0, total - len(seq.block_ids) - len(computed_blocks))
        revived = sum(1 for b in computed_blocks if self.blocks[b].ref_count == 0)
        return needed if needed + revived <= len(self._free) else None

    def _block_tokens(self, seq: Sequence, index: int) -> list[int]:
        return seq.token_ids[index * self.block_size : (index + 1) * self.block_size]

    def _hash_of(self, block_id: int) -> bytes:
        block_hash = self.blocks[block_id].block_hash
        if block_hash is None:
            raise RuntimeError(f"block {block_id} was offered as a prefix hit but has no hash")
        return block_hash

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _forget_hash(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.block_hash is not None and self._cached.get(block.block_hash) == block_id:
            del self._cached[block.block_hash]
        block.block_hash = None

    def _forget_int8(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.is_int8:
            block.is_int8 = False
            self.num_quantized_blocks -= 1
