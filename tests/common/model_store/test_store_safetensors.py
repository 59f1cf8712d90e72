"""Tiny random HF checkpoints of every supported architecture, read back through the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import ModelSource, SafetensorsSource, open_model, weight_names

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NUM_LAYERS = 4
TINY = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": 4,
    "vocab_size": 128,
    "max_position_embeddings": 256,
}
CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 32}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
}


def save_tiny_model(
    directory: Path,
    architecture: str,
    *,
    num_kv_heads: int,
    tied: bool,
    dtype: Any = None,
    shard: bool = False,
) -> dict[str, np.ndarray]:
    """Save a randomly initialised tiny model; return its state dict as float32 numpy arrays."""
    config_name, model_name, extra = CONFIGS[architecture]
    config = getattr(transformers, config_name)(
        **TINY, **extra, num_key_value_heads=num_kv_heads, tie_word_embeddings=tied, eos_token_id=[5, 7]
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config)
    with torch.no_grad():
        for parameter in model.parameters():  # random norms and biases too, not HF's ones/zeros
            parameter.normal_()
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(directory, max_shard_size="40KB" if shard else "50GB")
    state = {k.removeprefix("model."): v.float().numpy() for k, v in model.state_dict().items()}
    return state


def assert_weights_equal(source: ModelSource, state: dict[str, np.ndarray]) -> None:
    weights = source.load_weights(0, NUM_LAYERS, embedding=True, head=True)
    assert list(weights) == weight_names(source.config, 0, NUM_LAYERS, embedding=True, head=True)
    assert set(weights) == set(state), set(weights) ^ set(state)
    for name, array in weights.items():
        assert array.dtype == np.float32 and array.flags.c_contiguous and array.flags.writeable, name
        np.testing.assert_array_equal(array, state[name], err_msg=name)


@pytest.mark.parametrize(
    ("architecture", "num_kv_heads", "tied"),
    [("llama", 2, False), ("llama", 1, True), ("mistral", 2, False), ("qwen2", 2, True), ("qwen3", 1, False)],
)
def test_fp32_weights_equal_state_dict(
    tmp_path: Path, architecture: str, num_kv_heads: int, tied: bool
) -> None:
    state = save_tiny_model(tmp_path, architecture, num_kv_heads=num_kv_heads, tied=tied)
    source = open_model(tmp_path)
    assert isinstance(source, SafetensorsSource)
    config = source.config
    assert config.architecture == architecture and config.model_id == tmp_path.name
    assert (config.num_layers, config.hidden_size, config.num_heads) == (NUM_LAYERS, 64, 4)
    assert config.num_kv_heads == num_kv_heads and config.tie_word_embeddings is tied
    assert config.head_dim == (32 if architecture == "qwen3" else 16)
    assert config.attention_bias is (architecture == "qwen2")
    assert config.qk_norm is (architecture == "qwen3")
    assert config.eos_token_ids == (5, 7)
    assert_weights_equal(source, state)
    assert sum(state[n].nbytes for n in state if n.startswith("layers.0.")) == config.weight_bytes_per_layer


def test_rope_and_sliding_window_settings(tmp_path: Path) -> None:
    save_tiny_model(tmp_path / "llama", "llama", num_kv_heads=2, tied=False)
    save_tiny_model(tmp_path / "mistral", "mistral", num_kv_heads=2, tied=False)
    save_tiny_model(tmp_path / "qwen2", "qwen2", num_kv_heads=2, tied=False)
    llama, mistral = open_model(tmp_path / "llama").config, open_model(tmp_path / "mistral").config
    assert (llama.rope_theta, llama.rope_scaling, llama.sliding_window) == (5e5, None, None)
    assert (mistral.rope_theta, mistral.sliding_window) == (10000.0, 32)
    assert open_model(tmp_path / "qwen2").config.sliding_window is None  # use_sliding_window=False

    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    scaling = {"rope_type": "linear", "factor": 2.0, "rope_theta": 12345.0}
    config.pop("rope_parameters", None)
    (tmp_path / "llama" / "config.json").write_text(json.dumps({**config, "rope_scaling": scaling}))
    scaled = open_model(tmp_path / "llama").config
    assert scaled.rope_theta == 12345.0
    assert scaled.rope_scaling is not None and scaled.rope_scaling["rope_type"] == "linear"
    assert scaled.rope_scaling["factor"] == 2.0


def test_bf16_weights_widen_exactly(tmp_path: Path) -> None:
    state = save_tiny_model(tmp_path, "qwen2", num_kv_heads=2, tied=False, dtype=torch.bfloat16)
    header_size = int.from_bytes((tmp_path / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((tmp_path / "model.safetensors").read_bytes()[8 : 8 + header_size])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    assert_weights_equal(open_model(tmp_path), state)


def test_fp16_weights(tmp_path: Path) -> None:
    state = save_tiny_model(tmp_path, "mistral", num_kv_heads=1, tied=True, dtype=torch.float16)
    assert_weights_equal(open_model(tmp_path), state)


def test_sharded_checkpoint(tmp_path: Path) -> None:
    state = save_tiny_model(tmp_path, "llama", num_kv_heads=2, tied=False, shard=True)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    source = open_model(tmp_path)
    assert_weights_equal(source, state)
    middle = source.load_weights(1, 3, embedding=False, head=False)
    assert {name.split(".")[1] for name in middle} == {"1", "2"}


def test_directory_tokenizer(tmp_path: Path, bundled: ModelSource) -> None:
    save_tiny_model(tmp_path, "llama", num_kv_heads=2, tied=True)
    source = open_model(tmp_path)
    with pytest.raises(ModelLoadError, match="cannot load the tokenizer of"):
        source.load_tokenizer()
    bundled.load_tokenizer().save_pretrained(tmp_path)
    tokenizer = open_model(tmp_path).load_tokenizer()
    messages = [{"role": "user", "content": "hi"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert isinstance(prompt, str)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.encode("hello world") == bundled.load_tokenizer().encode("hello world")
