"""config_from_hf on mixture-of-experts configs (Mixtral, Qwen3-MoE): the expert fields, which
layers stay dense, the bytes a layer holds with every expert, and the variants refused."""

from __future__ import annotations

from typing import Any

import pytest

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store.config import config_from_hf

SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
}


def test_mixtral_fields_and_bytes() -> None:
    from transformers import MixtralConfig

    hf = MixtralConfig(**SHAPE, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2)
    config = config_from_hf(hf, "tiny-mixtral")
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (8, 2, 128)
    assert config.norm_topk_prob and config.dense_mlp_layers == () and not config.qk_norm
    q, kv = 4 * 16, 2 * 16
    attention = 64 * (2 * q + 2 * kv)
    experts = 8 * (3 * 64 * 128 + 64)  # every expert's gate/up/down and the router's row
    assert config.weight_bytes_per_layer == 4 * (attention + experts + 2 * 64)


def test_qwen3_moe_dense_layers_and_renormalisation() -> None:
    from transformers import Qwen3MoeConfig

    hf = Qwen3MoeConfig(
        **SHAPE,
        num_key_value_heads=2,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=32,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
    )
    config = config_from_hf(hf, "tiny-qwen3-moe")
    assert config.qk_norm and not config.norm_topk_prob  # Qwen3MoeConfig's default
    assert config.dense_mlp_layers == (0, 2, 3)  # (i + 1) % 2 != 0, and 3 listed
    assert [config.is_moe_layer(i) for i in range(4)] == [False, True, False, False]
    assert config.layer_weight_bytes(0) < config.layer_weight_bytes(1) == config.weight_bytes_per_layer
    assert config_from_hf(Qwen3MoeConfig(**SHAPE, norm_topk_prob=True), "x").norm_topk_prob


def test_more_experts_a_token_than_experts_refused() -> None:
    from transformers import Qwen3MoeConfig

    hf = Qwen3MoeConfig(**SHAPE, num_experts=4, num_experts_per_tok=8)
    with pytest.raises(ModelLoadError, match="8 experts a token of 4"):
        config_from_hf(hf, "bad")
