"""GGUF's 5-bit blocks and K-quant super-blocks read as groupwise codes, scales and minimums.

Design. Each format below is, exactly, groups of consecutive inputs with integer codes and one
scale (and minimum) per group, `w = scale · code + minimum` (`GroupQuantized`), so the decoders
only unpack bits; no weight is re-derived from floats. The layouts are llama.cpp's (ggml-common.h):

- Q5_0, 32 weights in 22 bytes: fp16 `d`, 32 high bits, 16 bytes of low nibbles;
  `w = d·(q − 16)`: held as signed codes `q − 16`, scale `d`, no minimum.
- Q5_1, 32 in 24 bytes: fp16 `d`, fp16 `m`, high bits, low nibbles; `w = d·q + m`.
- Q4_K, 256 in 144 bytes: fp16 `d`, fp16 `dmin`, 12 bytes packing eight 6-bit sub-block scales
  `sc` and minimums `m`, 128 bytes of nibbles; eight groups of 32 with `w = d·sc·q − dmin·m`:
  scale `d·sc`, minimum `−dmin·m` (both exact in fp32: an 11-bit mantissa times a 6-bit integer).
- Q5_K, 256 in 176 bytes: Q4_K's header, then 32 bytes of fifth bits and the 128 nibble bytes.
- Q6_K, 256 in 210 bytes: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 sub-block scales,
  fp16 `d`; sixteen groups of 16 with `w = d·sc·(q − 32)`: signed codes `q − 32`, scale `d·sc`.

The bit order is gguf-py's `dequantize_blocks`, which the tests compare against bit for bit.
"""

from __future__ import annotations

import numpy as np

from mohawk_common.model_store.quantized import GroupQuantized

SUPER_BLOCK = 256  # weights in a K-quant super-block
# GGUF type -> (weights a block, bytes a block)
BLOCK_LAYOUTS = {
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}


def decode_5bit_or_kquant(blocks: np.ndarray, type_name: str) -> GroupQuantized:
    """`blocks`: uint8 [rows, blocks a row, bytes a block] of a format in `BLOCK_LAYOUTS`."""
    rows = blocks.shape[0]
    flat = blocks.reshape(-1, blocks.shape[-1])
    codes, scales, mins, bits, group = _DECODERS[type_name](flat)
    factors = None
    if type_name == "Q6_K":  # the stored int8 sub-block scales and fp16 super-block scales
        sub_scales = np.ascontiguousarray(flat[:, 192:208]).view(np.int8).reshape(rows, -1)
        super_scales = np.ascontiguousarray(flat[:, 208:210]).view(np.float16).reshape(rows, -1)
        factors = (sub_scales, super_scales)
    return GroupQuantized(
        codes.reshape(rows, -1),
        scales.reshape(rows, -1),
        None if mins is None else mins.reshape(rows, -1),
        bits,
        group,
        type_name,
        factors,
        SUPER_BLOCK,
    )


_Decoded = tuple[np.ndarray, np.ndarray, np.ndarray | None, int, int]


def _fp16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _five_bits(high: np.ndarray, nibbles: np.ndarray) -> np.ndarray:
    """A 32-weight block's codes: weight j's low nibble is byte j % 16's low (j < 16) or high
    nibble, its fifth bit bit j of the little-endian 32-bit `high`."""
    low = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1)
    fifth = np.unpackbits(high, axis=-1, bitorder="little")
    return low | (fifth << 4)


def _q5_0(blocks: np.ndarray) -> _Decoded:
    codes = _five_bits(blocks[:, 2:6], blocks[:, 6:]).astype(np.int8) - np.int8(16)
    return codes, _fp16(blocks[:, 0:2]), None, 5, 32


def _q5_1(blocks: np.ndarray) -> _Decoded:
    codes = _five_bits(blocks[:, 4:8], blocks[:, 8:])
    return codes, _fp16(blocks[:, 0:2]), _fp16(blocks[:, 2:4]), 5, 32


def _k_scales_and_mins(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: the eight sub-blocks' scales `d·sc` and minimums `−dmin·m`, fp32 [blocks, 8].

    Bytes 0–3 hold sc 0–3 in their low 6 bits, 4–7 m 0–3; bytes 8–11 hold the low nibbles of
    sc 4–7 and, high nibbles, of m 4–7, whose top 2 bits are the top bits of bytes 0–3 / 4–7."""
    packed = blocks[:, 4:16].reshape(-1, 3, 4)
    d_bytes, m_bytes, low = packed[:, 0], packed[:, 1], packed[:, 2]
    sc = np.concatenate((d_bytes & 0x3F, (low & 0x0F) | ((d_bytes >> 2) & 0x30)), axis=-1)
    m = np.concatenate((m_bytes & 0x3F, (low >> 4) | ((m_bytes >> 2) & 0x30)), axis=-1)
    d, dmin = _fp16(blocks[:, 0:2]), _fp16(blocks[:, 2:4])
    return d[:, None] * sc.astype(np.float32), -(dmin[:, None] * m.astype(np.float32))


def _k_nibbles(nibbles: np.ndarray) -> np.ndarray:
    """[blocks, 128] bytes -> [blocks, 8, 32] 4-bit codes: each 32 bytes give a pair of sub-blocks,
    the low nibbles the first, the high nibbles the second."""
    pairs = nibbles.reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (pairs & 0x0F).reshape(-1, 8, 32)


def _q4_k(blocks: np.ndarray) -> _Decoded:
    scales, mins = _k_scales_and_mins(blocks)
    return _k_nibbles(blocks[:, 16:]), scales, mins, 4, 32


def _q5_k(blocks: np.ndarray) -> _Decoded:
    scales, mins = _k_scales_and_mins(blocks)
    # fifth bits: byte j of the 32 holds bit s of weight j of sub-block s
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    fifth = (blocks[:, 16:48].reshape(-1, 1, 32) >> shifts) & 0x01
    return _k_nibbles(blocks[:, 48:]) | (fifth << 4), scales, mins, 5, 32


def _q6_k(blocks: np.ndarray) -> _Decoded:
    """Each 128 weights take 64 low-nibble bytes (weights j and j + 64) and 32 high bytes (2 bits
    each for weights j, j + 32, j + 64, j + 96)."""
    low_shifts = np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    high_shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    low = ((blocks[:, :128].reshape(-1, 2, 1, 64) >> low_shifts) & 0x0F).reshape(-1, 8, 32)
    high = ((blocks[:, 128:192].reshape(-1, 2, 1, 32) >> high_shifts) & 0x03).reshape(-1, 8, 32)
    codes = (low | (high << 4)).astype(np.int8) - np.int8(32)
    sub_scales = blocks[:, 192:208].view(np.int8).astype(np.float32)
    scales = _fp16(blocks[:, 208:210])[:, None] * sub_scales
    return codes, scales, None, 6, 16


_DECODERS = {"Q5_0": _q5_0, "Q5_1": _q5_1, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
