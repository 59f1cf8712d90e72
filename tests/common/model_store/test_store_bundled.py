"""The bundled SmolLM2 GGUF: config, tokenizer, weights against transformers, layer-range memory."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

from mohawk_common.model_store import (
    GGUFSource,
    ModelSource,
    bundled_model_path,
    weight_names,
    weights_nbytes,
)
from mohawk_common.model_store.gguf_file import GGUFFile

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def hf_state_dict(hf_reference_model: Any) -> dict[str, np.ndarray]:
    """transformers' own dequantized weights of the bundled GGUF (the reference), as numpy."""
    state = hf_reference_model.state_dict()
    return {key.removeprefix("model."): value.numpy() for key, value in state.items()}


def test_bundled_path_and_config(bundled: ModelSource) -> None:
    assert bundled_model_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert isinstance(bundled, GGUFSource)
    config = bundled.config
    assert config.architecture == "llama"
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (30, 576, 1536)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (9, 3, 64)
    assert config.vocab_size == 49152
    assert config.rope_theta == 100000.0
    assert config.rope_scaling is None
    assert config.tie_word_embeddings is True
    assert (config.attention_bias, config.qk_norm, config.sliding_window) == (False, False, None)
    assert config.bos_token_id == 1
    assert config.eos_token_ids == (2,)
    assert config.model_id
    assert bundled.hf_config.model_type == "llama"


def test_tokenizer_has_chat_template(bundled: ModelSource) -> None:
    tokenizer = bundled.load_tokenizer()
    assert bundled.load_tokenizer() is tokenizer  # cached on the source
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert "<|im_start|>user\nhi<|im_end|>" in prompt
    assert isinstance(prompt, str)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"


@pytest.mark.parametrize(("start", "end"), [(0, 2), (14, 15), (28, 30)])
def test_weights_equal_transformers_gguf_loading(
    bundled: ModelSource, hf_state_dict: dict[str, np.ndarray], start: int, end: int
) -> None:
    embedding, head = start == 0, end == bundled.config.num_layers
    weights = bundled.load_weights(start, end, embedding=embedding, head=head)
    assert list(weights) == weight_names(bundled.config, start, end, embedding=embedding, head=head)
    for name, array in weights.items():
        assert array.dtype == np.float32 and array.flags.c_contiguous and array.flags.writeable, name
        np.testing.assert_array_equal(array, hf_state_dict[name], err_msg=name)


@pytest.fixture(scope="module")
def gguf_reader(bundled: ModelSource) -> Any:
    """The `gguf` package's own reader of the bundled file, to check our lean one against."""
    import gguf

    return gguf.GGUFReader(bundled.path)


def test_lean_gguf_index_matches_gguf_reader(bundled: ModelSource, gguf_reader: Any) -> None:
    lean = GGUFFile(bundled.path)
    assert lean.metadata["general.architecture"] == "llama"
    assert lean.metadata["llama.block_count"] == 30
    template = gguf_reader.fields["tokenizer.chat_template"].contents()
    assert lean.metadata["tokenizer.chat_template"] == template
    assert list(lean.tensors) == [tensor.name for tensor in gguf_reader.tensors]
    for tensor in gguf_reader.tensors:
        info = lean.tensors[tensor.name]
        assert info.tensor_type == tensor.tensor_type, tensor.name
        assert info.shape == tuple(int(n) for n in reversed(tensor.shape)), tensor.name
        assert info.nbytes == tensor.n_bytes, tensor.name
        assert info.offset == tensor.data_offset, tensor.name
    for name in ["token_embd.weight", "blk.0.attn_norm.weight", "blk.29.ffn_down.weight"]:
        reference = next(tensor for tensor in gguf_reader.tensors if tensor.name == name)
        assert lean.raw(lean.tensors[name]).tobytes() == reference.data.tobytes(), name


def test_q_and_k_are_unpermuted(
    bundled: ModelSource, hf_state_dict: dict[str, np.ndarray], gguf_reader: Any
) -> None:
    # The raw GGUF rows differ from HF's: equality with HF is only possible through the un-permute.
    from gguf.quants import dequantize

    weights = bundled.load_weights(3, 4, embedding=False, head=False)
    for part in ("q", "k"):
        raw_tensor = next(t for t in gguf_reader.tensors if t.name == f"blk.3.attn_{part}.weight")
        raw = dequantize(raw_tensor.data, raw_tensor.tensor_type)
        hf_weight = hf_state_dict[f"layers.3.self_attn.{part}_proj.weight"]
        assert raw.shape == hf_weight.shape
        assert not np.array_equal(raw, hf_weight)
        np.testing.assert_array_equal(weights[f"layers.3.self_attn.{part}_proj.weight"], hf_weight)


def test_layer_range_reads_only_its_layers(bundled: ModelSource) -> None:
    config = bundled.config
    tracemalloc.start()
    try:
        first_third = bundled.load_weights(0, 10, embedding=False, head=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    first_bytes = weights_nbytes(first_third)
    assert first_bytes == 10 * config.weight_bytes_per_layer
    # Dequantizing tensor by tensor: the peak stays near the result, far below the whole model.
    assert peak < first_bytes + 32 * MIB, (peak, first_bytes)
    del first_third

    all_bytes = weights_nbytes(bundled.load_weights(0, 30, embedding=False, head=False))
    assert 0.30 <= first_bytes / all_bytes <= 0.37

    stages: dict[str, Any] = {}
    for start, end in [(0, 10), (10, 20), (20, 30)]:
        weights = bundled.load_weights(start, end, embedding=start == 0, head=end == 30)
        stages[f"[{start},{end})"] = weights_nbytes(weights)
        del weights
    report = ", ".join(f"{key}: {nbytes / MIB:.1f} MiB ({nbytes} B)" for key, nbytes in stages.items())
    print(f"\nlayers [0,10) alone: {first_bytes} B; [0,30) alone: {all_bytes} B; stages: {report}")
    embedding_bytes = config.vocab_size * config.hidden_size * 4
    assert stages["[0,10)"] == first_bytes + embedding_bytes
    # Tied head: lm_head is the embedding matrix; the final norm adds hidden_size floats.
    assert stages["[20,30)"] == 10 * config.weight_bytes_per_layer + embedding_bytes + config.hidden_size * 4
