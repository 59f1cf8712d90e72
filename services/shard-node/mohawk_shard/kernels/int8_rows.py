"""The 5-to-8-bit CPU kernel (`int8_rows.cpp`): GGUF's Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 codes a
byte each, multiplied in integers by int8 activations.

Design. These formats were unpacked to floats a slice at a time on every call (`GroupwiseLinear`'s
torch path): two to three times a dense fp32 matmul at decode. This kernel runs them as llama.cpp's
`vec_dot_q8_0_q8_0`/`vec_dot_q6_K_q8_K` family does: each row's groups of 32 activations are
quantized to int8 (the 4-bit kernel's quantizer), and each group's dot product with the codes is an
integer one (VNNI's `vpdpbusd` where the CPU has it). The codes are held unsigned, shifted up by a
per-format `offset` that the kernel takes back exactly from the activations' integer sums; Q6_K's
int8 sub-block scales multiply their half group's integer product in integers and its fp16
super-block scale is the float scale, so Q6_K, Q8_0, Q5_0 and Q5_1 run on exactly the file's
weights (Q5_K's `d·sc` and `dmin·m` are rounded to fp16, as the 4-bit kernel does for Q4_K). Each
output is the same sequence of operations whatever the rows, threads or instruction set: batch
invariant by construction. Held per weight: a byte of code, plus fp16 scales a group of 32 (Q8_0,
Q5_0: 1.0625 bytes; Q5_1, Q5_K with minimums: 1.125); Q6_K's codes in 6 bits, as the file holds
them (a nibble plane and a plane of top bits, rebuilt to a byte a code in registers), with its
int8 scales per 16 and fp16 per 256: 0.8203 bytes, the file's (a byte a code held 1.0703, and a
step read 30% more for it). Repacked once at load from the codes the file's blocks decode to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mohawk_common.model_store.quantized import GroupQuantized
from mohawk_shard.kernels.int4_rows import aligned, fits_fp16
from mohawk_shard.kernels.library import kernel

GROUP_SIZE = 32
SUB_GROUP = 16  # Q6_K's sub-blocks
SUPER_BLOCK = 256
COLUMN_BLOCK = 16
CODES_PER_WORD = 4
# source format -> what its codes are shifted up by to be unsigned (formats with minimums: 0)
OFFSETS = {"Q8_0": 128, "Q5_0": 16, "Q6_K": 32, "Q5_1": 0, "Q5_K": 0}
FORMATS = frozenset(OFFSETS)


@dataclass(frozen=True, slots=True)
class PackedInt8:
    """A weight in the kernel's layout (the header of `int8_rows.cpp`)."""

    codes: torch.Tensor  # int32 [N/16, K/4, 16], four unsigned codes a word; Q6_K [N/16, K/8 + K/16, 16]
    scales: torch.Tensor  # float16 [N/16, K/32, 16]; Q6_K: [N/16, K/256, 16]
    mins: torch.Tensor | None  # float16 [N/16, K/32, 16]
    subs: torch.Tensor | None  # int8 [N/16, K/16, 16]: Q6_K's sub-block scales
    offset: int
    out_features: int

    @property
    def in_features(self) -> int:
        words = self.codes.shape[1]  # a column's: K/4, or Q6_K's K/8 + K/16
        return words * 16 // 3 if self.subs is not None else words * CODES_PER_WORD


def supports(weight: GroupQuantized, device: torch.device) -> bool:
    """Whether `weight` can run here on this kernel: a format of `FORMATS` from the file, N a
    multiple of 16, K of 32 (256 with Q6_K's scale factors), fp16-sized tables."""
    out_features, in_features = weight.shape
    fmt = weight.source_format
    if device.type != "cpu" or fmt not in FORMATS or out_features % COLUMN_BLOCK or kernel() is None:
        return False
    if fmt == "Q6_K":
        return weight.scale_factors is not None and in_features % SUPER_BLOCK == 0
    tables = [weight.scales] if weight.mins is None else [weight.scales, weight.mins]
    return weight.group_size == GROUP_SIZE and in_features % GROUP_SIZE == 0 and fits_fp16(*tables)


def pack(weight: GroupQuantized, device: torch.device) -> PackedInt8:
    """A `supports`-ed weight's codes and tables -> the layout, once at load."""
    out_features, in_features = weight.shape
    blocks = out_features // COLUMN_BLOCK
    offset = OFFSETS[weight.source_format]
    unsigned = (weight.codes.astype(np.int16) + offset).astype(np.uint8)
    if weight.source_format == "Q6_K":
        words = six_bit_words(unsigned).reshape(blocks, COLUMN_BLOCK, -1).transpose(0, 2, 1)
    else:
        by_word = unsigned.reshape(blocks, COLUMN_BLOCK, in_features // CODES_PER_WORD, CODES_PER_WORD)
        words = by_word.transpose(0, 2, 1, 3).reshape(blocks, -1, COLUMN_BLOCK * CODES_PER_WORD)

    def per_block(values: np.ndarray, dtype: type) -> torch.Tensor:
        table: np.ndarray = values.astype(dtype).reshape(blocks, COLUMN_BLOCK, -1).transpose(0, 2, 1)
        return aligned(table).to(device)

    subs = None
    if weight.source_format == "Q6_K" and weight.scale_factors is not None:
        sub_scales, super_scales = weight.scale_factors
        scales, subs = per_block(super_scales, np.float16), per_block(sub_scales, np.int8)
    else:
        scales = per_block(weight.scales, np.float16)
    return PackedInt8(
        codes=aligned(np.ascontiguousarray(words).view(np.int32)).to(device),
        scales=scales,
        mins=None if weight.mins is None else per_block(weight.mins, np.float16),
        subs=subs,
        offset=offset,
        out_features=out_features,
    )


def six_bit_words(codes: np.ndarray) -> np.ndarray:
    """uint8 codes [N, K] below 64 -> uint32 words [N, K/8 + K/16]: the 6-bit layout's nibble words,
    then its top-bit words (the header of `int8_rows.cpp`)."""
    rows = codes.shape[0]
    by_eight = codes.reshape(rows, -1, 2, 4).astype(np.uint32)  # [N, K/8, half, j]
    nibble_bytes = (by_eight[:, :, 0] & 15) | (by_eight[:, :, 1] & 15) << 4  # [N, K/8, j]
    by_sixteen = (codes.reshape(rows, -1, 4, 4).astype(np.uint32) >> 4) & 3  # [N, K/16, t, j]
    top_bytes = np.bitwise_or.reduce(by_sixteen << (2 * np.arange(4, dtype=np.uint32))[:, None], axis=2)
    byte_shifts = 8 * np.arange(4, dtype=np.uint32)
    nibble_words = np.bitwise_or.reduce(nibble_bytes << byte_shifts, axis=-1)
    top_words = np.bitwise_or.reduce(top_bytes << byte_shifts, axis=-1)
    return np.concatenate([nibble_words, top_words], axis=1)


def matmul(x: torch.Tensor, packed: PackedInt8) -> torch.Tensor:
    """float32 rows x [M, K] times a packed weight -> float32 [M, N]."""
    return torch.ops.mohawk.int8_rows_mm.default(
        x, packed.codes, packed.scales, packed.mins, packed.subs, packed.out_features, packed.offset
    )


def row_codes(packed: PackedInt8, rows: torch.Tensor) -> torch.Tensor:
    """int16 codes [n, K] of output `rows` (int64 [n]), the offset taken back: the file's codes."""
    words = packed.codes[rows // COLUMN_BLOCK, :, rows % COLUMN_BLOCK]  # [n, K/4] int32
    # shifts, not a dtype view: a traced decode step records these (TorchScript cannot alias a
    # dtype view); the mask drops the arithmetic shift's sign
    shifts = 8 * torch.arange(CODES_PER_WORD, dtype=torch.int32, device=words.device)
    if packed.subs is not None:  # Q6_K in 6 bits: each input's low nibble and top two bits
        eighths = packed.in_features // 8
        nibble_bytes = (words[:, :eighths].unsqueeze(-1) >> shifts) & 0xFF  # [n, K/8, j]
        low = torch.stack([nibble_bytes & 15, nibble_bytes >> 4], dim=2)  # [n, K/8, half, j]
        top_bytes = (words[:, eighths:].unsqueeze(-1) >> shifts) & 0xFF  # [n, K/16, j]
        pairs = 2 * torch.arange(4, dtype=torch.int32, device=words.device)
        top = (top_bytes.unsqueeze(2) >> pairs[:, None]) & 3  # [n, K/16, t, j]
        unsigned = low.reshape(rows.shape[0], -1) | top.reshape(rows.shape[0], -1) << 4
        return unsigned.to(torch.int16) - packed.offset
    unsigned = (words.unsqueeze(-1) >> shifts) & 0xFF
    return unsigned.reshape(rows.shape[0], -1).to(torch.int16) - packed.offset


def row_weights(packed: PackedInt8, rows: torch.Tensor) -> torch.Tensor:
    """float32 weights [n, K] of output `rows`: what an embedding lookup in a tied table reads."""
    codes = row_codes(packed, rows).float()
    blocks, within = rows // COLUMN_BLOCK, rows % COLUMN_BLOCK
    if packed.subs is not None:
        subs = packed.subs[blocks, :, within].float()  # [n, K/16]
        supers = packed.scales[blocks, :, within].float()  # [n, K/256]
        per_16 = subs * supers.repeat_interleave(SUPER_BLOCK // SUB_GROUP, dim=1)
        return (codes.view(rows.shape[0], -1, SUB_GROUP) * per_16[..., None]).view(rows.shape[0], -1)
    grouped = codes.view(rows.shape[0], -1, GROUP_SIZE) * packed.scales[blocks, :, within].float()[..., None]
    if packed.mins is not None:
        grouped = grouped + packed.mins[blocks, :, within].float()[..., None]
    return grouped.view(rows.shape[0], -1)


def dense_weight(packed: PackedInt8) -> torch.Tensor:
    """The float32 weight [N, K] the kernel multiplies by (for tests and checks)."""
    return row_weights(packed, torch.arange(packed.out_features, device=packed.codes.device))
