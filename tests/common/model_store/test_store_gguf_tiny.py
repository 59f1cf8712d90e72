"""A tiny F32 GGUF written the way llama.cpp's converter does, read back to the original weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from mohawk_common.model_store import GGUFSource, open_model
from mohawk_common.model_store.gguf_source import gguf_tensor_name, permute_rotary_rows, unpermute_rotary_rows

NUM_LAYERS, HIDDEN, INTERMEDIATE, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, VOCAB = 2, 64, 96, 4, 2, 16, 128


def llama_cpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """Copied from llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def random_llama_state(untied: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = {"embed_tokens.weight": (VOCAB, HIDDEN), "norm.weight": (HIDDEN,)}
    if untied:
        shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    for i in range(NUM_LAYERS):
        p = f"layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (NUM_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": (NUM_KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": (NUM_KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, NUM_HEADS * HEAD_DIM),
            p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
        }
    return {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}


def write_llama_gguf(
    path: Path, state: dict[str, np.ndarray], matrix_type: GGMLQuantizationType | None = None
) -> None:
    """`matrix_type`: store every 2-D tensor in that GGUF type (Q4_0, Q4_1, Q8_0) instead of F32."""
    import gguf
    from gguf.quants import quantize

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(NUM_LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(NUM_HEADS)
    writer.add_head_count_kv(NUM_KV_HEADS)
    writer.add_rope_freq_base(50000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_rope_dimension_count(HEAD_DIM)
    for name, array in state.items():
        if ".q_proj." in name:
            array = llama_cpp_permute(array, NUM_HEADS, NUM_HEADS)
        elif ".k_proj." in name:
            array = llama_cpp_permute(array, NUM_HEADS, NUM_KV_HEADS)
        array = np.ascontiguousarray(array)
        if matrix_type is not None and array.ndim == 2:
            writer.add_tensor(gguf_tensor_name(name), quantize(array, matrix_type), raw_dtype=matrix_type)
        else:
            writer.add_tensor(gguf_tensor_name(name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_permute_helpers_invert_llama_cpp() -> None:
    weights = np.arange(NUM_KV_HEADS * HEAD_DIM * 3, dtype=np.float32).reshape(-1, 3)
    permuted = llama_cpp_permute(weights, NUM_HEADS, NUM_KV_HEADS)
    assert not np.array_equal(permuted, weights)
    np.testing.assert_array_equal(permute_rotary_rows(weights, NUM_KV_HEADS), permuted)
    np.testing.assert_array_equal(unpermute_rotary_rows(permuted, NUM_KV_HEADS), weights)
    # Head 0's GGUF rows interleave its two halves: rows 0, 8, 1, 9, ... of the HF order.
    assert permuted[:4, 0].tolist() == [0.0, 24.0, 3.0, 27.0]


@pytest.mark.parametrize("untied", [False, True])
def test_tiny_gguf_round_trips(tmp_path: Path, untied: bool) -> None:
    state = random_llama_state(untied)
    write_llama_gguf(tmp_path / "tiny.gguf", state)
    source = open_model(tmp_path)  # a directory holding exactly one .gguf
    assert isinstance(source, GGUFSource)
    config = source.config
    assert (config.model_id, config.num_layers, config.num_kv_heads, config.head_dim) == (
        "tiny-llama",
        2,
        2,
        16,
    )
    assert (config.rope_theta, config.tie_word_embeddings) == (50000.0, not untied)
    weights = source.load_weights(0, NUM_LAYERS, embedding=True, head=True)
    expected = state | ({} if untied else {"lm_head.weight": state["embed_tokens.weight"]})
    assert set(weights) == set(expected)
    for name, array in weights.items():
        np.testing.assert_array_equal(array, expected[name], err_msg=name)
    later = source.load_weights(1, 2, embedding=False, head=True)
    np.testing.assert_array_equal(later["lm_head.weight"], expected["lm_head.weight"])
