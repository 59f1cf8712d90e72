"""The Q4_K CPU kernel (`q4k_rows.cpp`, in the library `library.py` builds): a Q4_K matmul held as
the file holds it, 6-bit scales and minimums as integers and each super-block's fp16 d and dmin.

Design. The group-scaled 4-bit kernel (`int4_rows.py`) holds every group's scale and minimum as
fp16 products (0.625 bytes a weight) and applies them in fp32 a group at a time, beside the integer
dot products. Q4_K's scales are 6-bit integers under a super-block's fp16 d (and its minimums under
dmin), so here the whole super-block of 256 stays in integers, as llama.cpp's `vec_dot_q4_K_q8_K`
keeps it: activations are quantized a row's super-block at a time (q8_K: one scale for 256, where
the group-scaled kernel takes one for 32), each group's dot product is multiplied by its 6-bit
scale in int32, the minimums' term comes from the activations' group sums, and fp32 comes in once a
super-block. 0.578 bytes a weight (the file: 0.5625). Batch invariant by construction, as the
group-scaled kernel is (the file header of `q4k_rows.cpp`). The loader takes this layout for a
fused matmul whose parts are all Q4_K and are repacked from the file's blocks
(`repack.q4k_from_blocks`); elsewhere Q4_K keeps the group-scaled layout.

It is called as the torch op `torch.ops.mohawk.q4k_rows_mm` (`ops.cpp`), from eager code and traced
decode steps alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mohawk_shard.kernels.int4_rows import CODES_PER_WORD, COLUMN_BLOCK, GROUP_SIZE, aligned

SUPER_BLOCK = 256


@dataclass(frozen=True, slots=True)
class PackedQ4K:
    """A Q4_K weight in the kernel's layout (the file header of `q4k_rows.cpp`)."""

    codes: torch.Tensor  # int32 [N/16, K/8, 16], eight 4-bit codes a word (int4_rows' layout)
    subs: torch.Tensor  # uint8 [N/16, K/64, 64]: per pair of groups, scales then minimums in pairs
    supers: torch.Tensor  # float16 [N/16, K/256, 32]: per super-block, 16 columns' d then dmin
    out_features: int


def pack(
    codes: np.ndarray, scales: np.ndarray, mins: np.ndarray, d: np.ndarray, dmin: np.ndarray
) -> PackedQ4K:
    """uint8 codes [N, K] in [0, 16), 6-bit scales and minimums [N, K/32], fp16 d and dmin
    [N, K/256] (w = d·scale·code − dmin·min) -> the layout; what the loader's repack writes."""
    out_features, in_features = codes.shape
    blocks, pairs = out_features // COLUMN_BLOCK, in_features // (2 * GROUP_SIZE)
    shifts = (4 * np.arange(CODES_PER_WORD, dtype=np.uint32))[None, None, :]
    wide = codes.astype(np.uint32).reshape(out_features, -1, CODES_PER_WORD)
    words = np.bitwise_or.reduce(wide << shifts, axis=-1).reshape(blocks, COLUMN_BLOCK, -1).transpose(0, 2, 1)

    def by_block(table: np.ndarray) -> np.ndarray:  # [N, X] -> [NB, X, 16]
        return table.reshape(blocks, COLUMN_BLOCK, -1).transpose(0, 2, 1)

    subs = np.empty((blocks, pairs, 64), dtype=np.uint8)
    scale_pairs = by_block(scales.astype(np.uint8)).reshape(blocks, pairs, 2, COLUMN_BLOCK)
    subs[:, :, :32] = scale_pairs.reshape(blocks, pairs, 32)
    min_pairs = by_block(mins.astype(np.uint8)).reshape(blocks, pairs, 2, COLUMN_BLOCK)
    subs[:, :, 32:] = min_pairs.transpose(0, 1, 3, 2).reshape(blocks, pairs, 32)
    supers = np.concatenate([by_block(d.astype(np.float16)), by_block(dmin.astype(np.float16))], axis=2)
    return PackedQ4K(
        codes=aligned(np.ascontiguousarray(words).view(np.int32)),
        subs=aligned(subs),
        supers=aligned(supers),
        out_features=out_features,
    )


def dense_weight(
    codes: torch.Tensor, subs: torch.Tensor, supers: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The weight [N, K] in `dtype`, as the kernel's layout holds it (d·scale·code − dmin·min): in
    fp32 the products are exact (an fp16 times a 6-bit and a 4-bit integer) and the difference is
    rounded once, as from fp64."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    blocks, words, _ = codes.shape
    shifts = 4 * torch.arange(CODES_PER_WORD, dtype=torch.int32)
    nibbles = (codes.unsqueeze(-1) >> shifts) & 15  # [NB, K/8, 16, 8]
    n = blocks * COLUMN_BLOCK
    by_group = nibbles.permute(0, 2, 1, 3).reshape(n, -1, GROUP_SIZE).to(work)
    pairs = subs.shape[1]
    scales = subs[:, :, :32].reshape(blocks, pairs, 2, COLUMN_BLOCK).permute(0, 3, 1, 2).reshape(n, -1)
    mins = subs[:, :, 32:].reshape(blocks, pairs, COLUMN_BLOCK, 2).permute(0, 2, 1, 3).reshape(n, -1)
    per_super = supers.to(work).reshape(blocks, -1, 2, COLUMN_BLOCK).permute(0, 3, 1, 2).reshape(n, -1, 2)
    d = per_super[..., 0].repeat_interleave(SUPER_BLOCK // GROUP_SIZE, dim=1)
    dmin = per_super[..., 1].repeat_interleave(SUPER_BLOCK // GROUP_SIZE, dim=1)
    weight = by_group * (d * scales.to(work))[..., None] - (dmin * mins.to(work))[..., None]
    return weight.reshape(n, words * CODES_PER_WORD).to(dtype)


def matmul(x: torch.Tensor, codes: torch.Tensor, subs: torch.Tensor, supers: torch.Tensor) -> torch.Tensor:
    """float32 rows x [M, K] times a Q4_K weight in the layout (`PackedQ4K`'s tensors) -> float32
    [M, N]."""
    return torch.ops.mohawk.q4k_rows_mm.default(x, codes, subs, supers, codes.shape[0] * COLUMN_BLOCK)
