"""`GroupwiseLinear` multiplies by exactly its codes' weights; `ConcatLinear` stacks its parts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks
from mohawk_common.model_store.quantized import GroupQuantized, quantize_groupwise
from mohawk_shard.model import groupwise_linear
from mohawk_shard.model.groupwise_linear import ConcatLinear, GroupwiseLinear
from mohawk_shard.model.quantized_layers import Int4Linear
from tests.common.model_store.test_kquant_blocks import random_blocks


@pytest.mark.parametrize("type_name", ["Q6_K", "Q5_K", "Q5_0", "Q5_1"])
def test_outputs_are_the_stored_weights_times_x(type_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(groupwise_linear, "UNPACK_ELEMENTS", 256 * 7)  # 7 rows a slice: a ragged last one
    raw = random_blocks(type_name, 40, 256, seed=3)
    weight = decode_gguf_blocks(raw, type_name, (40, 256))
    bias = torch.randn(40)
    layer = GroupwiseLinear(weight, torch.device("cpu"), bias)
    assert layer.chunk_rows == 7
    stored = torch.from_numpy(weight.dequantize())
    assert torch.equal(layer.dense_weight(), stored)
    x = torch.randn(2, 3, 256)
    torch.testing.assert_close(layer(x), x @ stored.t() + bias, atol=1e-4, rtol=1e-4)  # fp32 sum order
    y = layer(x.bfloat16())  # CUDA's compute dtype: unpacked to bf16
    assert y.dtype == torch.bfloat16
    expected = x @ stored.t() + bias
    # bf16 activations, weights and outputs: a few parts in a thousand of the output's size
    torch.testing.assert_close(y.float(), expected, atol=0.02 * expected.abs().max().item(), rtol=0)


def test_q8_0_codes_are_held_one_byte_each() -> None:
    weight = quantize_groupwise(np.random.default_rng(1).standard_normal((8, 64), dtype=np.float32), bits=8)
    signed = GroupQuantized(
        (weight.codes.astype(np.int16) - 128).astype(np.int8), weight.scales, None, 8, 32, "Q8_0"
    )
    layer = GroupwiseLinear(signed, torch.device("cpu"))
    assert layer.codes.dtype == torch.int8 and layer.mins is None
    x = torch.randn(1, 64)
    torch.testing.assert_close(layer(x), x @ torch.from_numpy(signed.dequantize()).t(), atol=1e-5, rtol=1e-5)


def test_concat_linear_stacks_its_parts_outputs() -> None:
    rng = np.random.default_rng(2)
    four_bit = quantize_groupwise(rng.standard_normal((16, 256), dtype=np.float32))
    six_bit = decode_gguf_blocks(random_blocks("Q6_K", 8, 256), "Q6_K", (8, 256))
    bias = torch.randn(24)
    fused = ConcatLinear(
        [Int4Linear(four_bit, torch.device("cpu")), GroupwiseLinear(six_bit, torch.device("cpu"))], bias
    )
    x = torch.randn(3, 256)
    y = fused(x)
    assert y.shape == (3, 24)
    expected = x @ torch.from_numpy(six_bit.dequantize()).t() + bias[16:]
    torch.testing.assert_close(y[:, 16:], expected, atol=1e-4, rtol=1e-4)
    assert "Q6_K" in fused.source_format
