"""`GroupwiseLinear` multiplies by its codes' weights (on CPU through the int8_rows kernel by default,
unpacked a slice at a time with `kernel="torch"`, as on CUDA); `ConcatLinear` stacks its parts; a
tied table is looked up in its head's codes, held once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks
from mohawk_common.model_store.quantized import GroupQuantized, quantize_groupwise
from mohawk_shard.kernels.library import kernel
from mohawk_shard.model import groupwise_linear
from mohawk_shard.model.groupwise_linear import ConcatLinear, GroupwiseLinear, SharedTableEmbedding
from mohawk_shard.model.quantized_layers import Int4Linear
from tests.common.model_store.test_kquant_blocks import random_blocks


@pytest.mark.parametrize("type_name", ["Q6_K", "Q5_K", "Q5_0", "Q5_1"])
def test_outputs_are_the_stored_weights_times_x(type_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(groupwise_linear, "UNPACK_ELEMENTS", 256 * 7)  # 7 rows a slice: a ragged last one
    raw = random_blocks(type_name, 40, 256, seed=3)
    weight = decode_gguf_blocks(raw, type_name, (40, 256))
    bias = torch.randn(40)
    layer = GroupwiseLinear(weight, torch.device("cpu"), bias, kernel="torch")
    assert layer.chunk_rows == 7
    stored = torch.from_numpy(fp16_tables(weight).dequantize())
    assert torch.equal(layer.dense_weight(), stored)
    x = torch.randn(2, 3, 256)
    torch.testing.assert_close(layer(x), x @ stored.t() + bias, atol=1e-4, rtol=1e-4)  # fp32 sum order
    y = layer(x.bfloat16())  # CUDA's compute dtype: unpacked to bf16
    assert y.dtype == torch.bfloat16
    expected = x @ stored.t() + bias
    # bf16 activations, weights and outputs: a few parts in a thousand of the output's size
    torch.testing.assert_close(y.float(), expected, atol=0.02 * expected.abs().max().item(), rtol=0)


def fp16_tables(weight: GroupQuantized) -> GroupQuantized:
    """The weight as the layer holds it: scales and minimums in fp16 (exact for the file's own
    fp16 tables; Q5_K's `d·sc` and `dmin·m` are rounded)."""
    if weight.scale_factors is not None:
        return weight
    mins = None if weight.mins is None else weight.mins.astype(np.float16).astype(np.float32)
    scales = weight.scales.astype(np.float16).astype(np.float32)
    return GroupQuantized(weight.codes, scales, mins, weight.bits, weight.group_size, weight.source_format)


def test_q8_0_codes_are_held_one_byte_each() -> None:
    weight = quantize_groupwise(np.random.default_rng(1).standard_normal((8, 64), dtype=np.float32), bits=8)
    signed = GroupQuantized(
        (weight.codes.astype(np.int16) - 128).astype(np.int8), weight.scales, None, 8, 32, "Q8_0"
    )
    layer = GroupwiseLinear(signed, torch.device("cpu"), kernel="torch")
    assert layer.codes.dtype == torch.int8 and layer.mins is None
    x = torch.randn(1, 64)
    expected = x @ torch.from_numpy(fp16_tables(signed).dequantize()).t()
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


def test_concat_linear_stacks_its_parts_outputs() -> None:
    rng = np.random.default_rng(2)
    four_bit = quantize_groupwise(rng.standard_normal((16, 256), dtype=np.float32))
    six_bit = decode_gguf_blocks(random_blocks("Q6_K", 8, 256), "Q6_K", (8, 256))
    bias = torch.randn(24)
    cpu = torch.device("cpu")
    fused = ConcatLinear([Int4Linear(four_bit, cpu), GroupwiseLinear(six_bit, cpu, kernel="torch")], bias)
    x = torch.randn(3, 256)
    y = fused(x)
    assert y.shape == (3, 24)
    expected = x @ torch.from_numpy(six_bit.dequantize()).t() + bias[16:]
    torch.testing.assert_close(y[:, 16:], expected, atol=1e-4, rtol=1e-4)
    assert "Q6_K" in fused.source_format


needs_kernels = pytest.mark.skipif(kernel() is None, reason="the compiled kernels do not build or run here")


@needs_kernels
@pytest.mark.parametrize("type_name", ["Q6_K", "Q5_K", "Q5_0", "Q5_1", "Q8_0"])
def test_the_cpu_default_is_the_integer_kernel(type_name: str) -> None:
    raw = random_blocks(type_name, 48, 512, seed=5)
    weight = decode_gguf_blocks(raw, type_name, (48, 512))
    bias = torch.randn(48)
    layer = GroupwiseLinear(weight, torch.device("cpu"), bias)
    assert layer.kernel_weight is not None and "int8_rows" in repr(layer)
    stored = torch.from_numpy(fp16_tables(weight).dequantize())
    assert torch.equal(layer.dense_weight(), stored)
    x = torch.randn(2, 3, 512)
    y = layer(x)
    expected = x @ stored.t()
    # int8 activations a group of 32: within a few percent of a row's largest output
    error = ((y - bias) - expected).abs().amax(-1) / expected.abs().amax(-1)
    assert error.max().item() < 3e-2, error.max().item()
    alone = torch.stack([layer(x[:, i : i + 1]) for i in range(3)], dim=1).squeeze(2)
    assert torch.equal(alone, y)  # each row alone gives the same bits
    bf16 = layer(x.bfloat16())
    assert bf16.dtype == torch.bfloat16


@needs_kernels
def test_a_tied_table_is_looked_up_in_the_heads_kernel_layout() -> None:
    raw = random_blocks("Q6_K", 64, 256, seed=6)
    head = GroupwiseLinear(decode_gguf_blocks(raw, "Q6_K", (64, 256)), torch.device("cpu"))
    table = SharedTableEmbedding(head, torch.float32)
    tokens = torch.tensor([[3, 63, 0], [17, 3, 40]])
    dense = head.dense_weight()
    assert torch.equal(table(tokens), dense[tokens])
    model = torch.nn.ModuleDict({"embed": table, "head": head})
    held = sum(b.numel() * b.element_size() for b in model.buffers())
    assert held == 64 * 256 * 3 // 4 + 64 * 256 // 16 + 64 * 256 // 256 * 2  # the head's alone: one copy
