"""GGUF Q4_0/Q4_1/Q8_0 blocks read as codes, scales and minimums: exactly the file's weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from mohawk_common.model_store import ModelSource, open_model
from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks
from mohawk_common.model_store.quantized import GROUP_SIZE, concat_rows, quantize_groupwise
from tests.common.model_store.test_store_gguf_tiny import NUM_LAYERS, random_llama_state, write_llama_gguf

FORMATS = [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0]


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_blocks_decode_to_what_gguf_dequantizes(qtype: GGMLQuantizationType) -> None:
    weights = np.random.default_rng(1).standard_normal((48, 160), dtype=np.float32)
    raw = quantize(weights, qtype)
    tensor = decode_gguf_blocks(raw, qtype.name, weights.shape)
    np.testing.assert_array_equal(tensor.dequantize(), dequantize(raw, qtype).reshape(weights.shape))
    assert tensor.bits == (8 if qtype.name == "Q8_0" else 4)
    if tensor.bits == 4:
        assert tensor.codes.min() >= 0 and tensor.codes.max() <= 15


def test_quantize_groupwise_is_within_half_a_step() -> None:
    weights = np.random.default_rng(2).standard_normal((16, 128), dtype=np.float32)
    tensor = quantize_groupwise(weights)
    error = np.abs(tensor.dequantize() - weights).reshape(16, -1, GROUP_SIZE).max(axis=-1)
    assert (error <= tensor.scales / 2 + 1e-6).all()
    fused = concat_rows([tensor, quantize_groupwise(weights[:4])])
    assert fused.shape == (20, 128)


def test_tiny_quantized_gguf_reads_unpermuted_codes(tmp_path: Path) -> None:
    state = random_llama_state(untied=True)
    write_llama_gguf(tmp_path / "tiny.gguf", state, GGMLQuantizationType.Q4_1)
    source = open_model(tmp_path / "tiny.gguf")
    for layer in range(NUM_LAYERS):
        for part in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):
            name = f"layers.{layer}.{part}.weight"
            assert source.stored_format(name) == "Q4_1"
            tensor = source.read_quantized(name)
            assert tensor is not None
            # the codes give exactly what the dequantizing path reads (q/k rows back in HF order)
            np.testing.assert_array_equal(tensor.dequantize(), source.read_tensor(name), err_msg=name)
    assert source.stored_format("layers.0.input_layernorm.weight") == "F32"
    assert source.read_quantized("layers.0.input_layernorm.weight") is None


def test_bundled_layers_and_tied_table_decode_exactly(bundled: ModelSource) -> None:
    for name in ("layers.7.self_attn.q_proj.weight", "layers.7.mlp.gate_proj.weight", "embed_tokens.weight"):
        tensor = bundled.read_quantized(name)
        assert tensor is not None
        np.testing.assert_array_equal(tensor.dequantize(), bundled.read_tensor(name), err_msg=name)
    assert bundled.stored_format("lm_head.weight") == "Q8_0"  # tied: the embedding's blocks
