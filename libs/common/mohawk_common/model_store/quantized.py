"""Groupwise-quantized tensors: GGUF's 4- and 8-bit blocks as codes, scales and minimums.

Design. Every format a kernel can run as stored reduces to one form: a weight matrix [N, K] cut
into groups of `group_size` consecutive inputs per row, each group holding integer codes and one
scale (and, for asymmetric formats, one minimum), so that `w = scale · code + minimum`. GGUF's
Q4_0 (`w = d·(q − 8)`, 32 weights a block) is scale `d`, minimum `−8d`; Q4_1 (`w = d·q + m`) is
scale `d`, minimum `m`; Q8_0 (`w = d·q`, q signed) has no minimum. The codes are read straight
from the file's blocks, never re-derived from dequantized floats, so a kernel that takes codes,
scales and minimums multiplies by exactly the file's weights. `quantize_groupwise` makes the same
form from float weights (min/max per group, as llama.cpp's Q4_1 quantizer does) for checkpoints
stored in fp16/bf16/fp32, or for tensors a kernel cannot run in their stored format. The 5-bit
formats and the K-quants (Q4_K, Q5_K, Q6_K) reduce to the same form (`kquants.py`): a Q4_K
super-block is eight groups of 32 with 4-bit codes, a Q6_K one sixteen groups of 16. Reading a
GGUF tensor's blocks into this form, whichever its type, is `gguf_blocks.decode_gguf_blocks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP_SIZE = 32  # weights per block of the 32-weight formats, and the 4-bit kernel's group
FOUR_BIT_FORMATS = frozenset({"Q4_0", "Q4_1", "Q4_K"})  # unsigned 4-bit codes in groups of 32
# every GGUF type `gguf_blocks.decode_gguf_blocks` reads, -> its group size
GROUP_SIZES = {"Q4_0": 32, "Q4_1": 32, "Q8_0": 32, "Q5_0": 32, "Q5_1": 32, "Q4_K": 32, "Q5_K": 32, "Q6_K": 16}
DECODABLE_FORMATS = frozenset(GROUP_SIZES)


@dataclass(frozen=True, slots=True)
class GroupQuantized:
    """`w[n, k] = scales[n, k // group_size] · codes[n, k] + mins[n, k // group_size]`.

    `codes` are uint8 in [0, 2^bits) where there are minimums, int8 (signed: Q8_0, Q5_0's
    `q − 16`, Q6_K's `q − 32`) where `mins` is None. `source_format` names where the codes came
    from (a GGUF type, or `int4` when they were quantized at load). `scale_factors`, where the
    format has them (Q6_K), are the scales as stored: int8 per group times an fp16 per
    `super_block` weights, whose product is `scales` exactly.
    """

    codes: np.ndarray
    scales: np.ndarray
    mins: np.ndarray | None
    bits: int
    group_size: int
    source_format: str
    scale_factors: tuple[np.ndarray, np.ndarray] | None = None
    super_block: int = 256

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.codes.shape)

    def dequantize(self) -> np.ndarray:
        """float32 weights [N, K]."""
        rows, cols = self.codes.shape
        groups = self.codes.reshape(rows, cols // self.group_size, self.group_size).astype(np.float32)
        out = groups * self.scales[..., None]
        if self.mins is not None:
            out += self.mins[..., None]
        return out.reshape(rows, cols)

    def take_rows(self, order: np.ndarray) -> GroupQuantized:
        """The same tensor with its rows reordered (e.g. undoing llama.cpp's rotary permutation)."""
        mins = None if self.mins is None else np.ascontiguousarray(self.mins[order])
        factors = None
        if self.scale_factors is not None:
            factors = (
                np.ascontiguousarray(self.scale_factors[0][order]),
                np.ascontiguousarray(self.scale_factors[1][order]),
            )
        return GroupQuantized(
            np.ascontiguousarray(self.codes[order]),
            np.ascontiguousarray(self.scales[order]),
            mins,
            self.bits,
            self.group_size,
            self.source_format,
            factors,
        )


@dataclass(frozen=True, slots=True)
class StoredBlocks:
    """A quantized tensor's blocks as the file stores them, for a loader that repacks them itself
    (the compiled kernels' `repack_blocks`): `raw` is a view of the mapped file, uint8 [file rows,
    bytes a row], never a copy; output row n of the [N, K] `shape` is file row `rows[n]` (a fused
    tensor's part, llama.cpp's rotary permutation undone), or row n where `rows` is None."""

    raw: np.ndarray
    type_name: str
    shape: tuple[int, int]
    rows: np.ndarray | None = None


def concat_rows(parts: list[GroupQuantized]) -> GroupQuantized:
    """Stack tensors along output rows (fused q/k/v or gate/up); all must share bits and groups."""
    first = parts[0]
    if any(p.bits != first.bits or p.group_size != first.group_size for p in parts):
        raise ValueError("cannot fuse tensors quantized with different bits or group sizes")
    mins = None
    if all(p.mins is not None for p in parts):
        mins = np.concatenate([p.mins for p in parts if p.mins is not None])
    elif any(p.mins is not None for p in parts):
        mins = np.concatenate([p.mins if p.mins is not None else np.zeros_like(p.scales) for p in parts])
    formats = sorted({p.source_format for p in parts})
    factors = None
    if all(p.scale_factors is not None for p in parts):
        factors = (
            np.concatenate([p.scale_factors[0] for p in parts if p.scale_factors is not None]),
            np.concatenate([p.scale_factors[1] for p in parts if p.scale_factors is not None]),
        )
    return GroupQuantized(
        np.concatenate([p.codes for p in parts]),
        np.concatenate([p.scales for p in parts]),
        mins,
        first.bits,
        first.group_size,
        "+".join(formats),
        factors,
    )


def quantize_groupwise(weight: np.ndarray, *, bits: int = 4, group_size: int = GROUP_SIZE) -> GroupQuantized:
    """Asymmetric min/max quantization of float weights [N, K], one scale and minimum per group."""
    rows, cols = weight.shape
    if cols % group_size:
        raise ValueError(f"{cols} inputs are not whole groups of {group_size}")
    levels = (1 << bits) - 1
    groups = weight.reshape(rows, cols // group_size, group_size).astype(np.float32)
    low, high = groups.min(axis=-1), groups.max(axis=-1)
    scales = (high - low) / levels
    safe = np.where(scales == 0, 1.0, scales)
    codes = np.clip(np.rint((groups - low[..., None]) / safe[..., None]), 0, levels)
    return GroupQuantized(
        codes.astype(np.uint8).reshape(rows, cols), scales, low, bits, group_size, f"int{bits}"
    )
