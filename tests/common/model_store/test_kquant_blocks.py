"""GGUF's 5-bit and K-quant blocks read as codes, scales and minimums: exactly gguf's weights."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks
from mohawk_common.model_store.kquants import BLOCK_LAYOUTS
from mohawk_common.model_store.quantized import GROUP_SIZES

# GGUF type -> byte offsets of its fp16 fields (random bytes there could be inf or NaN)
_FP16_FIELDS = {
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "Q2_K": (80, 82),
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
}
UNDECODED_LAYOUTS = {"Q2_K": (256, 84)}  # a format with no groupwise decoding, for fallback tests
OTHER_LAYOUTS = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20)}  # decoded by gguf_blocks itself


def random_blocks(
    type_name: str, rows: int, cols: int, seed: int = 0, exponents: tuple[int, int] = (-14, -4)
) -> np.ndarray:
    """Valid blocks of `type_name` for a [rows, cols] tensor: random codes and sub-block scales,
    finite fp16 scales of 2^`exponents[0]` up to 2^`exponents[1]`; uint8 [rows, bytes a row], as
    a GGUF file stores them."""
    rng = np.random.default_rng(seed)
    block_weights, block_bytes = (BLOCK_LAYOUTS | UNDECODED_LAYOUTS | OTHER_LAYOUTS)[type_name]
    num_blocks = rows * cols // block_weights
    blocks = rng.integers(0, 256, (num_blocks, block_bytes), dtype=np.uint8)
    for offset in _FP16_FIELDS[type_name]:
        magnitude = rng.uniform(0.5, 2.0, num_blocks) * 2.0 ** rng.integers(*exponents, num_blocks)
        scale = magnitude.astype(np.float16)
        blocks[:, offset : offset + 2] = scale.view(np.uint8).reshape(num_blocks, 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("type_name", sorted(BLOCK_LAYOUTS))
def test_blocks_decode_to_what_gguf_dequantizes(type_name: str) -> None:
    rows, cols = 12, 512
    raw = random_blocks(type_name, rows, cols, seed=len(type_name))
    tensor = decode_gguf_blocks(raw, type_name, (rows, cols))
    expected = dequantize(raw, GGMLQuantizationType[type_name]).reshape(rows, cols)
    np.testing.assert_array_equal(tensor.dequantize(), expected)
    assert tensor.group_size == GROUP_SIZES[type_name]
    assert tensor.scales.shape == (rows, cols // tensor.group_size)
    if tensor.mins is None:  # signed codes centred on zero
        assert tensor.codes.dtype == np.int8
        assert -(1 << (tensor.bits - 1)) <= tensor.codes.min() and tensor.codes.max() < 1 << (tensor.bits - 1)
    else:
        assert tensor.codes.dtype == np.uint8 and tensor.codes.max() < 1 << tensor.bits


def test_q4_k_is_four_bit_groups_of_32() -> None:
    raw = random_blocks("Q4_K", 4, 256)
    tensor = decode_gguf_blocks(raw, "Q4_K", (4, 256))
    assert (tensor.bits, tensor.group_size, tensor.codes.max()) == (4, 32, 15)
    assert tensor.mins is not None and (tensor.mins <= 0).all()  # −dmin·m


def test_q6_k_keeps_its_stored_scale_factors() -> None:
    """Q6_K's scales are int8 per 16 weights times fp16 per 256: their product is `scales`, exactly."""
    tensor = decode_gguf_blocks(random_blocks("Q6_K", 6, 512), "Q6_K", (6, 512))
    assert tensor.scale_factors is not None
    sub_scales, super_scales = tensor.scale_factors
    assert sub_scales.dtype == np.int8 and super_scales.dtype == np.float16
    per_group = np.repeat(super_scales.astype(np.float32), tensor.super_block // tensor.group_size, axis=1)
    np.testing.assert_array_equal(sub_scales.astype(np.float32) * per_group, tensor.scales)
    reordered = tensor.take_rows(np.array([5, 0, 3, 1, 2, 4]))
    assert reordered.scale_factors is not None
    np.testing.assert_array_equal(reordered.scale_factors[0], sub_scales[[5, 0, 3, 1, 2, 4]])
