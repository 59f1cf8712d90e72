"""The two-tier KV rule, shared by the block manager (which counts) and the backends (which store).

Design. With `kv_cache_dtype="int8"` a sequence's newest blocks stay as the cache stores them
(`kv_cache.kv_storage_dtype`: fp16 on an fp32 CPU stage, else the compute dtype) and its older
full blocks are stored int8 with one absmax scale per block and KV head. A block turns cold
once it is full and `KV_RECENT_BLOCKS` full blocks follow it, i.e. block `i` of a sequence whose
KV covers `L` tokens is cold when `i < L // block_size - KV_RECENT_BLOCKS`. Full blocks are never
written again (prefix-cached blocks are shared only once full), so quantizing one is final until the
block is handed out for new content. Two recent blocks keep the last 16-32 tokens, where decode
attention mostly looks, at full precision, and leave all but two blocks of a long context int8.
The rule reads only what every stage sees (block tables and context lengths), so every stage of a
pipeline quantizes the same blocks at the same step with no extra message.

Memory. Every block has an int8 home; the recent ("hot") tier is a smaller pool of
`num_hot_blocks(num_blocks)` blocks that recent blocks borrow (one in `HOT_FRACTION`, at least
`MIN_HOT_BLOCKS` so that one step's writes always fit). A block therefore costs, on average,
`cold + hot / HOT_FRACTION` bytes, and that is what budget sizing divides by: the same
`kv_cache_memory_mb` holds about 1.6x the blocks of an fp16 or bf16 cache and 2.7x those of an
fp32 one (SmolLM2, 16-token blocks: 231,120 bytes a block instead of 368,640 in fp16).
"""

from __future__ import annotations

from dataclasses import dataclass

KV_CACHE_DTYPES = ("auto", "float32", "int8")
KV_RECENT_BLOCKS = 2
HOT_FRACTION = 8
MIN_HOT_BLOCKS = 128
INT8_SCALE_BYTES = 4  # one fp32 scale per block, KV head, and K or V


def num_cold_blocks(context_len: int, block_size: int) -> int:
    """How many leading blocks of a sequence whose KV covers `context_len` tokens are int8."""
    return max(0, context_len // block_size - KV_RECENT_BLOCKS)


def num_hot_blocks(num_blocks: int) -> int:
    """Size of the recent (hot) pool that recent blocks borrow from."""
    return min(num_blocks, max(-(-num_blocks // HOT_FRACTION), MIN_HOT_BLOCKS))


@dataclass(frozen=True, slots=True)
class TierBytes:
    """Bytes of one KV block (K and V, all layers of a stage) in each tier."""

    hot: int
    cold: int

    @classmethod
    def of(
        cls, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, element_size: int
    ) -> TierBytes:
        values = 2 * num_layers * num_kv_heads * head_dim * block_size
        scales = 2 * num_layers * num_kv_heads * INT8_SCALE_BYTES
        return cls(hot=values * element_size, cold=values + scales)

    @property
    def average(self) -> int:
        """Budget cost of one block: its int8 home plus its share of the hot pool."""
        return self.cold + -(-self.hot // HOT_FRACTION)

    @property
    def saved(self) -> int:
        """What one block stored int8 instead of in the hot tier's dtype saves."""
        return self.hot - self.cold
