"""`complete_config` on configs as transformers' GGUF reader leaves them: each Gemma setting from
the file's key where it has one, else as llama.cpp derives it; a `llama` file with experts as
Mixtral; head_dim from `attention.key_length`. (Whole files:
tests/shard/engine/test_gguf_architectures.py.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store.gguf_config import complete_config


def _gemma(num_layers: int, hidden: int = 4608, heads: int = 32, head_dim: int = 128) -> Any:
    return SimpleNamespace(
        num_hidden_layers=num_layers, hidden_size=hidden, num_attention_heads=heads, head_dim=head_dim
    )


def test_query_pre_attn_scalar_as_llama_cpp_derives_it() -> None:
    nine_b = complete_config(_gemma(42, 3584, 16, 256), "gemma2", {}, {})
    assert nine_b.query_pre_attn_scalar == 256  # head_dim
    large = complete_config(_gemma(46), "gemma2", {}, {})
    assert large.query_pre_attn_scalar == 144  # 27B: hidden / heads
    gemma3_27b = complete_config(_gemma(62, 5376, 32), "gemma3", {}, {})
    assert gemma3_27b.query_pre_attn_scalar == 168
    keyed = complete_config(_gemma(46), "gemma2", {"gemma2.attention.scale": 0.125}, {})
    assert keyed.query_pre_attn_scalar == pytest.approx(64.0)  # the file's key wins


def test_gemma2_defaults_and_keys() -> None:
    bare = complete_config(_gemma(4), "gemma2", {}, {})
    assert (bare.attn_logit_softcapping, bare.final_logit_softcapping, bare.sliding_window) == (
        50.0,
        30.0,
        4096,
    )
    assert bare.layer_types == ["sliding_attention", "full_attention"] * 2
    keys = {"gemma2.attn_logit_softcapping": 20.0, "gemma2.final_logit_softcapping": 10.0}
    keyed = complete_config(_gemma(4), "gemma2", keys | {"gemma2.attention.sliding_window": 8}, {})
    assert (keyed.attn_logit_softcapping, keyed.final_logit_softcapping, keyed.sliding_window) == (
        20.0,
        10.0,
        8,
    )


def test_gemma3_sliding_layers_and_rope() -> None:
    window = {"gemma3.attention.sliding_window": 512}
    period = complete_config(_gemma(7), "gemma3", window, {})
    assert [t == "sliding_attention" for t in period.layer_types] == [True] * 5 + [False, True]
    assert period.rope_parameters == {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    assert period.attn_logit_softcapping is None and period.final_logit_softcapping is None
    keys = window | {"gemma3.attention.sliding_window_pattern": 2, "gemma3.rope.freq_base": 5e5}
    keys |= {"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0}
    keys |= {"gemma3.rope.freq_base_swa": 20000.0}
    keyed = complete_config(_gemma(4), "gemma3", keys, {})
    assert keyed.layer_types == ["sliding_attention", "full_attention"] * 2
    assert keyed.rope_parameters["full_attention"] == {
        "rope_type": "linear",
        "rope_theta": 5e5,
        "factor": 8.0,
    }
    assert keyed.rope_parameters["sliding_attention"]["rope_theta"] == 20000.0
    flags = {"gemma3.attention.sliding_window_pattern": (True, False, False)}
    assert complete_config(_gemma(3), "gemma3", window, flags).layer_types == [
        "sliding_attention",
        "full_attention",
        "full_attention",
    ]
    assert complete_config(_gemma(3), "gemma3", {}, {}).layer_types == ["full_attention"] * 3  # no window
    with pytest.raises(ModelLoadError, match="yarn"):
        complete_config(_gemma(3), "gemma3", {"gemma3.rope.scaling.type": "yarn"}, {})
    with pytest.raises(ModelLoadError, match="2 entries for 3 layers"):
        complete_config(
            _gemma(3), "gemma3", window, {"gemma3.attention.sliding_window_pattern": (True, False)}
        )


def test_a_llama_file_with_experts_is_mixtral() -> None:
    from transformers import AutoConfig

    llama = AutoConfig.for_model(
        "llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4
    )
    assert complete_config(llama, "llama", {}, {}) is llama  # no experts: Llama
    keys = {"llama.expert_count": 8, "llama.expert_used_count": 2}
    mixtral = complete_config(llama, "llama", keys, {})
    assert mixtral.model_type == "mixtral"
    assert (mixtral.num_local_experts, mixtral.num_experts_per_tok, mixtral.intermediate_size) == (8, 2, 96)
    assert (mixtral.hidden_size, mixtral.num_hidden_layers, mixtral.sliding_window) == (64, 2, None)


def test_head_dim_from_key_length() -> None:
    """transformers' qwen3 reader keeps Qwen3Config's head_dim of 128 whatever the file says."""
    qwen3 = SimpleNamespace(head_dim=128, num_hidden_layers=2)
    assert complete_config(qwen3, "qwen3", {"qwen3.attention.key_length": 64}, {}).head_dim == 64
    unkeyed = SimpleNamespace(head_dim=128, num_hidden_layers=2)
    assert complete_config(unkeyed, "qwen3", {}, {}).head_dim == 128
