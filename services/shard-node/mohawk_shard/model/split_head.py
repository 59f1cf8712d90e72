"""A Q8_0 LM head held once as its two nibbles: ranked 4-bit, rescored and looked up exactly.

Design. SmolLM2's tied embedding is Q8_0: 49152 × 576 codes in [-127, 127] with an fp16 scale per
32. The head must rank the whole vocabulary fast (the 4-bit kernel: `Int4Linear`) yet give the
file's exact logits to the tokens greedy decoding and top-k pick among, and a first stage must look
up exact rows of the same table. Holding the Q8_0 table beside a re-grouped 4-bit copy costs
1.6× the file's bytes. Instead each code, shifted to `u = q + 128` in [1, 255], is split into its
high nibble `u >> 4` and low nibble `u & 15`. The high nibbles alone are a 4-bit matrix with
`w ≈ 16·d·hi + d·(7.5 − 128)` (the low nibble's mean, 7.5, stands in for it; error at most 7.5·d),
which the kernel packs as it likes; the low nibbles sit beside it, two a byte. A shortlist row (or
an embedding row) is `d · (16·hi + lo − 128)` again, exactly the file's weights, its high nibbles
read back out of the kernel's CPU packing (`Int4Linear.row_codes`). Bytes: 8 bits of codes,
1 bit of the kernel's bf16 (scale, zero) pairs and 0.5 bit of fp16 scales a weight, against Q8_0's
8.5: 1.12× the file, for the head and the tied table together.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mohawk_common.model_store.quantized import GroupQuantized, StoredBlocks
from mohawk_shard.kernels import int4_rows
from mohawk_shard.kernels.repack import split_q8_from_blocks
from mohawk_shard.kernels.top_rows import top_indices
from mohawk_shard.model.quantized_layers import Int4Linear, cpu_pack_block

LOW_NIBBLE_MEAN = 7.5
Q8_OFFSET = 128
_SPLIT_ROWS = 8192  # table rows split at a time


def split_head_fits(table: GroupQuantized, device: torch.device) -> bool:
    """Whether the split head can be used: a Q8_0 table on CPU, whose 4-bit packing this build can
    read rows back out of (the row kernel's always; tinygemm's where its layout probe knows it)."""
    if table.bits != 8 or table.mins is not None or device.type != "cpu":
        return False
    rows, columns = table.shape
    return (
        int4_rows.supports(table.shape, table.group_size, device) or cpu_pack_block(rows, columns) is not None
    )


class SplitQ8Head(nn.Module):
    """y = x·Wᵀ for a Q8_0 table W: a 4-bit ranking pass, then the `shortlist` best logits exact.

    Built from the table's decoded codes (`from_table`, numpy) or straight from the file's blocks
    in one compiled pass (`from_blocks`, `kernels/repack.py`): the same buffers bit for bit.
    """

    low: torch.Tensor
    scales: torch.Tensor

    def __init__(
        self,
        approximate: Int4Linear,
        low: torch.Tensor,
        scales: torch.Tensor,
        group_size: int,
        shortlist: int,
    ) -> None:
        """`approximate`: the high nibbles; `low`: the low nibbles, uint8 [rows, columns/2];
        `scales`: the file's fp16 scales [rows, columns/group_size]."""
        super().__init__()
        self.num_rows, self.num_columns = approximate.out_features, approximate.in_features
        self.group_size = group_size
        self.approximate = approximate
        self.register_buffer("low", low)
        self.register_buffer("scales", scales)
        self.shortlist = min(shortlist, self.num_rows)
        self.source_format = "Q8_0 split: 4-bit high nibbles ranked, shortlist exact"

    @classmethod
    def from_table(cls, table: GroupQuantized, device: torch.device, shortlist: int = 64) -> SplitQ8Head:
        rows, columns = table.shape
        high = np.empty((rows, columns), dtype=np.uint8)
        low = np.empty((rows, columns // 2), dtype=np.uint8)  # two nibbles a byte
        for start in range(0, rows, _SPLIT_ROWS):  # a slice at a time: no int16 copy of the table
            shifted = table.codes[start : start + _SPLIT_ROWS].astype(np.int16) + Q8_OFFSET  # [1, 255]
            stop = start + shifted.shape[0]
            high[start:stop] = shifted >> 4
            nibbles = (shifted & 15).astype(np.uint8)
            low[start:stop] = nibbles[:, ::2] | nibbles[:, 1::2] << 4
        d = table.scales.astype(np.float32)
        approximate = Int4Linear(
            GroupQuantized(high, 16 * d, (LOW_NIBBLE_MEAN - Q8_OFFSET) * d, 4, table.group_size, "Q8_0 high"),
            device,
        )
        scales = torch.from_numpy(table.scales).to(device=device, dtype=torch.float16)
        return cls(approximate, torch.from_numpy(low).to(device), scales, table.group_size, shortlist)

    @classmethod
    def from_blocks(
        cls, blocks: StoredBlocks, device: torch.device, shortlist: int = 64
    ) -> SplitQ8Head | None:
        """From the file's Q8_0 blocks in one threaded pass; None where that pass does not apply
        (no compiled kernels, rows not whole column blocks, a scale past fp16)."""
        split = split_q8_from_blocks(blocks, device)
        if split is None:
            return None
        packed, low, scales = split
        approximate = Int4Linear(packed, device, source_format="Q8_0 high")
        return cls(approximate, low, scales, 32, shortlist)

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The file's exact float32 rows of `token_ids` (any shape) -> [..., columns]."""
        flat = token_ids.reshape(-1)
        high = self.approximate.row_codes(flat)
        low_bytes = self.low.index_select(0, flat)
        low = torch.stack((low_bytes & 15, low_bytes >> 4), dim=-1).view(-1, self.num_columns)
        codes = high.to(torch.int16) * 16 + low - Q8_OFFSET
        groups = codes.float().view(-1, self.num_columns // self.group_size, self.group_size)
        out = groups * self.scales.index_select(0, flat).float().unsqueeze(-1)
        return out.view(*token_ids.shape, self.num_columns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.approximate.forward(x).float()
        candidates = top_indices(logits, self.shortlist)  # [M, shortlist]
        # a product and a sum over the row, not a batched matmul: its kernel's result for one row
        # changes with how many rows share the call, and a logit must not depend on the batch
        exact = (self.rows(candidates) * x.float().unsqueeze(-2)).sum(-1)
        return logits.scatter_(-1, candidates, exact)


class SplitHeadEmbedding(nn.Module):
    """A first stage's token table read from the split head it shares (a tied model)."""

    def __init__(self, head: SplitQ8Head, dtype: torch.dtype) -> None:
        super().__init__()
        self.head, self.dtype = head, dtype

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.head.rows(token_ids).to(self.dtype)
