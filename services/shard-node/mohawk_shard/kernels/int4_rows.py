"""The row-block 4-bit CPU kernel (`int4_rows.cpp`, in the library `library.py` builds).

Design. torch's CPU 4-bit kernel (tinygemm, `_weight_int4pack_mm_for_cpu`) takes bf16
activations and runs a row at a time, so a batched decode pays it once per row and every call pays
a cast on each side. `int4_rows.cpp` takes fp32 rows, quantizes each row's groups of 32 to int8
with a scale of their own (llama.cpp's q8 activations), multiplies them by the 4-bit codes in
integers (AVX-512 VNNI's `vpdpbusd` where the CPU has it: a `vpmaddubsw` + `vpmaddwd` pair
elsewhere, the same exact sums) and applies each group's scales in fp32; each weight tile is read
once for a block of up to four rows (three on AVX2). Every output is the same sequence of
operations whatever the number of rows, their place in the call, the thread count or the
instruction set: batch invariant by construction. Against a dense fp32 matmul it errs by about a
percent of a row's largest output, as llama.cpp does: on the bundled model, teacher-forced along
the fp32 path's answers, its top-8 logits differ from fp32 by as much as llama.cpp's
(`bench/native_precision.py`). Against the fp32 row kernel it replaced, a decode step's matmuls
took half the time at 1 row and 2.4-2.6x less at 32-128 rows. Scales and mins are held as fp16
(GGUF's own are fp16, so Q4_0/Q4_1 keep them exactly), the same bytes as tinygemm's bf16 pairs.
Where the library does not load (`library.kernel()` is None), `Int4Linear` keeps tinygemm.

It is called as the torch op `torch.ops.mohawk.int4_rows_mm` (`ops.cpp`), from eager code and
traced decode steps (`traced_decode.py`) alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mohawk_shard.kernels.huge_pages import huge_empty
from mohawk_shard.kernels.library import kernel

GROUP_SIZE = 32
COLUMN_BLOCK = 16  # columns a code word row holds
CODES_PER_WORD = 8
FP16_MAX = 65504.0


@dataclass(frozen=True, slots=True)
class PackedInt4:
    """A weight in the kernel's layout (module docstring of `int4_rows.cpp`)."""

    codes: torch.Tensor  # int32 [N/16, K/8, 16], eight 4-bit codes a word
    scales: torch.Tensor  # float16 [N/16, K/32, 16]
    mins: torch.Tensor  # float16 [N/16, K/32, 16]
    out_features: int


def supports(weight_shape: tuple[int, ...], group_size: int, device: torch.device) -> bool:
    """Whether a weight [N, K] can run here on the row kernel (N a multiple of 16, groups of 32)."""
    out_features, in_features = weight_shape
    return (
        device.type == "cpu"
        and group_size == GROUP_SIZE
        and in_features % GROUP_SIZE == 0
        and out_features % COLUMN_BLOCK == 0
        and kernel() is not None
    )


def fits_fp16(*tables: np.ndarray) -> bool:
    """Whether scales and mins keep their size in fp16 (GGUF's own are fp16: exact); tinygemm,
    whose are bf16, takes a weight whose do not."""
    return all(bool(np.all(np.abs(t) <= FP16_MAX)) for t in tables)


_PACK_ROWS = 4096  # rows `pack` widens at a time


def pack(codes: np.ndarray, scales: np.ndarray, mins: np.ndarray, device: torch.device) -> PackedInt4:
    """uint8 codes [N, K] in [0, 16), scales and mins [N, K/32] (w = scale·code + min) -> the layout."""
    out_features, in_features = codes.shape
    blocks = out_features // COLUMN_BLOCK
    shifts = (4 * np.arange(CODES_PER_WORD, dtype=np.uint32))[None, None, :]
    words = np.empty((out_features, in_features // CODES_PER_WORD), dtype=np.uint32)
    for start in range(0, out_features, _PACK_ROWS):  # a bounded slice at a time: a 262k-row table
        part = codes[start : start + _PACK_ROWS]  # would otherwise widen to 8x its bytes at once
        wide = part.astype(np.uint32).reshape(part.shape[0], -1, CODES_PER_WORD)
        words[start : start + part.shape[0]] = np.bitwise_or.reduce(wide << shifts, axis=-1)
    words = words.reshape(blocks, COLUMN_BLOCK, -1).transpose(0, 2, 1)  # [NB, K/8, 16]

    def per_block(values: np.ndarray) -> torch.Tensor:
        table = values.astype(np.float16).reshape(blocks, COLUMN_BLOCK, -1).transpose(0, 2, 1)
        return aligned(table).to(device)  # [NB, G, 16]

    return PackedInt4(
        codes=aligned(words.view(np.int32)).to(device),
        scales=per_block(scales),
        mins=per_block(mins),
        out_features=out_features,
    )


def aligned(array: np.ndarray) -> torch.Tensor:
    """A copy in torch's memory, 64-byte aligned (numpy's is not: the kernel's aligned loads need 32),
    on huge pages where it can be (`huge_pages.py`)."""
    source = torch.from_numpy(np.ascontiguousarray(array))
    return huge_empty(*source.shape, dtype=source.dtype).copy_(source)


def unpack_rows(codes: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """uint8 codes [n, K] of output rows `rows` (int64 [n]), read back out of the layout."""
    words = codes[rows // COLUMN_BLOCK, :, rows % COLUMN_BLOCK]  # [n, K/8]
    shifts = 4 * torch.arange(CODES_PER_WORD, dtype=torch.int32, device=words.device)
    nibbles = (words.unsqueeze(-1) >> shifts) & 15  # arithmetic shift: the mask drops the sign
    return nibbles.reshape(rows.shape[0], codes.shape[1] * CODES_PER_WORD).to(torch.uint8)


def dense_weight(
    codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, out_features: int, dtype: torch.dtype
) -> torch.Tensor:
    """The weight [N, K] in `dtype`, as the kernel's arithmetic sees it (scale·code + min)."""
    blocks, words, _ = codes.shape
    shifts = 4 * torch.arange(CODES_PER_WORD, dtype=torch.int32, device=codes.device)
    nibbles = (codes.unsqueeze(-1) >> shifts) & 15  # [NB, K/8, 16, 8]
    by_group = nibbles.permute(0, 2, 1, 3).reshape(blocks * COLUMN_BLOCK, -1, GROUP_SIZE).float()
    scale = scales.float().transpose(1, 2).reshape(blocks * COLUMN_BLOCK, -1, 1)
    minimum = mins.float().transpose(1, 2).reshape(blocks * COLUMN_BLOCK, -1, 1)
    weight = (by_group * scale + minimum).reshape(blocks * COLUMN_BLOCK, words * CODES_PER_WORD)
    return weight.to(dtype)


def matmul(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, n: int
) -> torch.Tensor:
    """float32 rows x [M, K] times a packed weight (`pack`'s tensors, N = `n`) -> float32 [M, N]."""
    return torch.ops.mohawk.int4_rows_mm.default(x, codes, scales, mins, n)
