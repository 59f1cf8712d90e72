"""A tiny Phi-3 GGUF (fused attn_qkv and ffn_up, as llama.cpp writes them) read back as the
canonical q/k/v and gate/up tensors, dense and as 4-bit codes; Phi-3 and Gemma variants the GGUF
reader would run wrong are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import open_model
from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks

NUM_LAYERS, HIDDEN, INTERMEDIATE, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, VOCAB = 2, 64, 96, 4, 2, 16, 128
Q_ROWS, KV_ROWS = NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM


def phi3_state() -> dict[str, np.ndarray]:
    """GGUF tensor name -> array, q/k/v and gate/up fused as in a Phi-3 checkpoint."""
    rng = np.random.default_rng(0)
    shapes = {
        "token_embd.weight": (VOCAB, HIDDEN),
        "output_norm.weight": (HIDDEN,),
        "output.weight": (VOCAB, HIDDEN),
    }
    for i in range(NUM_LAYERS):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (HIDDEN,),
            f"blk.{i}.attn_qkv.weight": (Q_ROWS + 2 * KV_ROWS, HIDDEN),
            f"blk.{i}.attn_output.weight": (HIDDEN, Q_ROWS),
            f"blk.{i}.ffn_norm.weight": (HIDDEN,),
            f"blk.{i}.ffn_up.weight": (2 * INTERMEDIATE, HIDDEN),
            f"blk.{i}.ffn_down.weight": (HIDDEN, INTERMEDIATE),
        }
    return {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}


def write_gguf(
    path: Path,
    state: dict[str, np.ndarray],
    arch: str = "phi3",
    rotary_dims: int = HEAD_DIM,
    fused_type: GGMLQuantizationType | None = None,
) -> None:
    import gguf
    from gguf.quants import quantize

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_block_count(NUM_LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(NUM_HEADS)
    writer.add_head_count_kv(NUM_KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_rope_dimension_count(rotary_dims)
    for name, array in state.items():
        if fused_type is not None and ("attn_qkv" in name or "ffn_up" in name):
            writer.add_tensor(name, quantize(array, fused_type), raw_dtype=fused_type)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_fused_tensors_split_into_canonical_names(tmp_path: Path) -> None:
    state = phi3_state()
    write_gguf(tmp_path / "phi3.gguf", state)
    source = open_model(tmp_path)
    assert source.config.architecture == "phi3"
    weights = source.load_weights(0, NUM_LAYERS, embedding=True, head=True)
    qkv, gate_up = state["blk.1.attn_qkv.weight"], state["blk.1.ffn_up.weight"]
    np.testing.assert_array_equal(weights["layers.1.self_attn.q_proj.weight"], qkv[:Q_ROWS])
    np.testing.assert_array_equal(weights["layers.1.self_attn.k_proj.weight"], qkv[Q_ROWS : Q_ROWS + KV_ROWS])
    np.testing.assert_array_equal(weights["layers.1.self_attn.v_proj.weight"], qkv[Q_ROWS + KV_ROWS :])
    np.testing.assert_array_equal(weights["layers.1.mlp.gate_proj.weight"], gate_up[:INTERMEDIATE])
    np.testing.assert_array_equal(weights["layers.1.mlp.up_proj.weight"], gate_up[INTERMEDIATE:])
    source.check_tensors()


def test_fused_quantized_tensors_split_by_rows(tmp_path: Path) -> None:
    from gguf.quants import quantize

    state = phi3_state()
    write_gguf(tmp_path / "phi3.gguf", state, fused_type=GGMLQuantizationType.Q4_0)
    source = open_model(tmp_path)
    assert source.stored_format("layers.0.self_attn.k_proj.weight") == "Q4_0"
    fused = state["blk.0.attn_qkv.weight"]
    whole = decode_gguf_blocks(quantize(fused, GGMLQuantizationType.Q4_0), "Q4_0", fused.shape).dequantize()
    k = source.read_quantized("layers.0.self_attn.k_proj.weight")
    assert k is not None
    np.testing.assert_array_equal(k.dequantize(), whole[Q_ROWS : Q_ROWS + KV_ROWS])
    np.testing.assert_array_equal(
        source.read_tensor("layers.0.self_attn.k_proj.weight"), whole[Q_ROWS : Q_ROWS + KV_ROWS]
    )


def test_partial_rotary_phi3_gguf_refused(tmp_path: Path) -> None:
    write_gguf(tmp_path / "phi4.gguf", phi3_state(), rotary_dims=HEAD_DIM // 2)
    with pytest.raises(ModelLoadError, match="partial rotary"):
        open_model(tmp_path)
