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

Sliding windows (`mohawk_common.kv_groups`). A model with sliding-window layers has several KV
groups, each with its own table per sequence, all drawing from this pool; a step appends the same
number of entries to every table, and the step's new ids go out group after group. Before a
sequence gets room for tokens from position p, each sliding group gives back the blocks wholly before
p - window + 1, which no query from p on reads, and marks their entries `NULL_BLOCK`; the stages
never read them again, so they need no message. Stages run steps in order, so a block given back
while an earlier step of its old owner is in flight is written by its new owner only after. A
prefix hit of m blocks needs every full group's first m blocks cached and each sliding group's
blocks from its window's start before position m × block_size (those before stay `NULL_BLOCK`);
cache entries are named per group, since each group holds other layers' KV for the same tokens.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from mohawk_common.kv_groups import NULL_BLOCK, KVGroup
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
        groups: tuple[KVGroup, ...] = (KVGroup(()),),
    ) -> None:
        """`int8_saving_per_block`: bytes a block saves once int8 (two-tier KV); None = one tier.
        `groups`: the model's KV groups (default one full-attention group)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError("a KV pool needs at least one block of at least one slot")
        if int8_saving_per_block is not None and (len(groups) > 1 or groups[0].is_sliding):
            raise ValueError("the int8 KV tier does not combine with sliding-window layers")
        self.groups = groups
        self.num_window_freed = 0  # blocks sliding groups gave back before their sequence ended
        self._first_live: dict[tuple[int, int], int] = {}  # (seq, group) -> first entry not given back
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
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def bytes_saved(self) -> int:
        """KV bytes the int8 tier saves now, against holding the same blocks in the hot tier's dtype."""
        return self.num_quantized_blocks * (self.int8_saving_per_block or 0)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Ids of cached blocks that hold a prefix of `seq` (at least one token is left to compute),
        group after group (`NULL_BLOCK` before a sliding group's window)."""
        if not self.enable_prefix_caching or seq.block_ids:
            return []
        num_full = (seq.num_tokens - 1) // self.block_size
        if len(self.groups) == 1 and not self.groups[0].is_sliding:
            hits: list[int] = []
            parent: bytes | None = None
            for index in range(num_full):
                parent = hash_block(parent, self._block_tokens(seq, index))
                block_id = self._cached.get(parent)
                if block_id is None:
                    break
                hits.append(block_id)
            return hits
        return self._grouped_hits(self._chain(seq, num_full))

    def num_hit_tokens(self, computed_blocks: list[int]) -> int:
        """Tokens a `get_computed_blocks` answer serves."""
        return len(computed_blocks) // len(self.groups) * self.block_size

    def can_allocate(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> bool:
        return self._num_missing_blocks(seq, num_new_tokens, computed_blocks or []) is not None

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> list[int] | None:
        """Give `seq` room for its next `num_new_tokens`; returns the block ids appended to its
        tables, group after group (each group gets as many).

        `computed_blocks` (from `get_computed_blocks`, only for a sequence without blocks) are shared
        and advance `seq.num_computed_tokens`. `None` means the pool is too full: preempt or wait.
        """
        computed_blocks = computed_blocks or []
        needed = self._num_missing_blocks(seq, num_new_tokens, computed_blocks)
        if needed is None:
            return None
        num_groups = len(self.groups)
        while len(seq.block_tables) < num_groups:
            seq.block_tables.append([])
        self._drop_out_of_window(seq, seq.num_computed_tokens)
        for block_id in computed_blocks:
            if block_id != NULL_BLOCK:
                self._take(block_id)
        num_hits = len(computed_blocks) // num_groups
        if computed_blocks:
            seq.num_cached_tokens = num_hits * self.block_size
            seq.num_computed_tokens = seq.num_cached_tokens
            self._seq_hashes[seq.seq_id] = (
                [self._hash_of(b) for b in computed_blocks]
                if num_groups == 1 and not self.groups[0].is_sliding
                else self._chain(seq, num_hits)
            )
        new_ids: list[int] = []
        for group, table in enumerate(seq.block_tables):
            group_ids = computed_blocks[group * num_hits : (group + 1) * num_hits]
            for _ in range(needed // num_groups):
                block_id = next(iter(self._free))
                self._forget_hash(block_id)
                self._forget_int8(block_id)
                self._take(block_id)
                group_ids.append(block_id)
            table.extend(group_ids)
            new_ids.extend(group_ids)
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
            for group, table in enumerate(seq.block_tables):
                if table[index] == NULL_BLOCK:
                    continue
                block = self.blocks[table[index]]
                key = _cache_key(group, block_hash)
                if key not in self._cached and block.block_hash is None:
                    block.block_hash = key
                    self._cached[key] = block.block_id

    def free(self, seq: Sequence) -> None:
        """Release every block of `seq` at once; shared blocks stay with their other owners."""
        for group, table in enumerate(seq.block_tables):
            for block_id in reversed(table):
                if block_id != NULL_BLOCK:
                    self._release(block_id)
            table.clear()
            self._first_live.pop((seq.seq_id, group), None)
        del seq.block_tables[1:]
        seq.num_cached_tokens = 0
        self._seq_hashes.pop(seq.seq_id, None)
        self._seq_num_int8.pop(seq.seq_id, None)

    def _drop_out_of_window(self, seq: Sequence, position: int) -> None:
        """Give back each sliding group's blocks that no query from `position` on reads."""
        for group, (kv_group, table) in enumerate(zip(self.groups, seq.block_tables, strict=True)):
            if not kv_group.is_sliding:
                continue
            start = self._first_live.get((seq.seq_id, group), 0)
            end = min(kv_group.first_needed_block(position, self.block_size), len(table))
            for index in range(start, end):
                if table[index] != NULL_BLOCK:
                    self._release(table[index])
                    self.num_window_freed += 1
                    table[index] = NULL_BLOCK
            self._first_live[(seq.seq_id, group)] = max(start, end)

    def _num_droppable(self, seq: Sequence, position: int) -> int:
        """Blocks `_drop_out_of_window(seq, position)` would return to the free list."""
        count = 0
        for group, (kv_group, table) in enumerate(zip(self.groups, seq.block_tables, strict=False)):
            if kv_group.is_sliding:
                start = self._first_live.get((seq.seq_id, group), 0)
                end = min(kv_group.first_needed_block(position, self.block_size), len(table))
                count += sum(1 for b in table[start:end] if b != NULL_BLOCK and self.blocks[b].ref_count == 1)
        return count

    def _chain(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The chained hashes of the first `num_blocks` blocks of `seq`."""
        hashes: list[bytes] = []
        for index in range(num_blocks):
            hashes.append(hash_block(hashes[-1] if hashes else None, self._block_tokens(seq, index)))
        return hashes

    def _grouped_hits(self, hashes: list[bytes]) -> list[int]:
        """The longest cached prefix every group can serve, as `get_computed_blocks` returns it."""
        num_hits = len(hashes)
        for group, kv_group in enumerate(self.groups):
            if not kv_group.is_sliding:
                run = 0
                while run < num_hits and _cache_key(group, hashes[run]) in self._cached:
                    run += 1
                num_hits = run
        while True:  # each sliding group may shorten the hit; stop once all of them agree
            agreed = num_hits
            for group, kv_group in enumerate(self.groups):
                if kv_group.is_sliding:
                    agreed = self._window_hit(group, kv_group, hashes, agreed)
            if agreed == num_hits:
                break
            num_hits = agreed
        hits: list[int] = []
        for group, kv_group in enumerate(self.groups):
            first = kv_group.first_needed_block(num_hits * self.block_size, self.block_size)
            hits.extend([NULL_BLOCK] * first)
            hits.extend(self._cached[_cache_key(group, h)] for h in hashes[first:num_hits])
        return hits

    def _window_hit(self, group: int, kv_group: KVGroup, hashes: list[bytes], limit: int) -> int:
        """The most blocks m <= `limit` whose window before m × block_size this group has cached."""
        cached = [_cache_key(group, h) in self._cached for h in hashes[:limit]]
        run = [0] * (limit + 1)  # run[m]: cached blocks in a row ending at block m - 1
        for m in range(1, limit + 1):
            run[m] = run[m - 1] + 1 if cached[m - 1] else 0
        for m in range(limit, 0, -1):
            if m - run[m] <= kv_group.first_needed_block(m * self.block_size, self.block_size):
                return m
        return 0

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
        num_groups = len(self.groups)
        num_hits = len(computed_blocks) // num_groups
        num_computed = max(seq.num_computed_tokens, num_hits * self.block_size)
        total = self.num_blocks_for(num_computed + num_new_tokens)
        needed = max(0, total - len(seq.block_ids) - num_hits) * num_groups
        revived = sum(1 for b in computed_blocks if b != NULL_BLOCK and self.blocks[b].ref_count == 0)
        available = len(self._free)
        if num_groups > 1 or self.groups[0].is_sliding:
            available += self._num_droppable(seq, seq.num_computed_tokens)
        return needed if needed + revived <= available else None

    def _block_tokens(self, seq: Sequence, index: int) -> list[int]:
        return seq.token_ids[index * self.block_size : (index + 1) * self.block_size]

    def _hash_of(self, block_id: int) -> bytes:
        block_hash = self.blocks[block_id].block_hash
        if block_hash is None:
            raise RuntimeError(f"block {block_id} was offered as a prefix hit but has no hash")
        return block_hash

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free[block_id] = None

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


def _cache_key(group: int, block_hash: bytes) -> bytes:
    """The prefix-cache name of a block of `group` holding the tokens `block_hash` names."""
    return block_hash if group == 0 else block_hash + group.to_bytes(2, "little")
