"""What `config_from_hf` keeps of Phi-3 and Gemma configs, and the variants it refuses rather than
run wrong (transformers' own config classes, no weights)."""

from __future__ import annotations

from typing import Any

import pytest

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store.config import config_from_hf


def hf(model_type: str, **options: Any) -> Any:
    from transformers import AutoConfig

    sizes = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 6}
    return AutoConfig.for_model(model_type, **(sizes | options))


def test_gemma3_layers_windows_and_bases() -> None:
    config = config_from_hf(hf("gemma3_text", head_dim=32, sliding_window=16, query_pre_attn_scalar=32), "g3")
    assert config.sliding_layers == (0, 1, 2, 3, 4)  # every sixth layer is global
    assert [config.layer_window(i) for i in (0, 5)] == [16, None]
    assert (config.rope_theta, config.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert (config.qk_norm, config.hidden_activation, config.query_pre_attn_scalar) == (True, "gelu_tanh", 32)
    assert config.num_layer_norms == 4


def test_gemma2_soft_caps_and_alternating_windows() -> None:
    config = config_from_hf(hf("gemma2", head_dim=16), "g2")
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
    assert config.sliding_layers == (0, 2, 4)


def test_mistral_window_on_every_layer_qwen2_off() -> None:
    mistral = config_from_hf(hf("mistral", sliding_window=32), "m")
    assert [mistral.layer_window(i) for i in range(6)] == [32] * 6
    assert config_from_hf(hf("qwen2", sliding_window=32), "q").layer_window(0) is None


def test_phi3_longrope_caps_context_and_partial_rotary() -> None:
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "short_factor": [1.0] * 4,
        "long_factor": [2.0] * 4,
    }
    config = config_from_hf(
        hf("phi3", max_position_embeddings=4096, original_max_position_embeddings=512, rope_parameters=rope),
        "p",
    )
    assert (config.max_position_embeddings, config.rotary_dim) == (512, 8)


@pytest.mark.parametrize(
    ("model_type", "options", "message"),
    [
        ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
        ("llama", {"hidden_act": "gelu"}, "activation 'gelu'"),
        ("gemma2", {"hidden_activation": "gelu", "head_dim": 16}, "activation 'gelu'"),
        ("gemma3_text", {"use_bidirectional_attention": True, "head_dim": 16}, "bidirectional"),
        ("gemma2", {"attention_bias": True, "head_dim": 16}, "attention_bias"),
    ],
)
def test_refused_variants(model_type: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        config_from_hf(hf(model_type, **options), "x")


def test_multimodal_gemma3_refused() -> None:
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gemma3'"):
        config_from_hf(hf("gemma3"), "x")
