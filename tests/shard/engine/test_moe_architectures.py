"""Mixtral and Qwen3-MoE on tiny random-weight models built here (no download), against
transformers: fp32 logits whole and split over two stages, greedy tokens through the engine, and
the bytes a stage holds (every expert of its layers). Variants cover Qwen3-MoE without and with
renormalised top-k, dense layers (`mlp_only_layers`, `decoder_sparse_step`), and a checkpoint
saved in transformers 5's fused 3-D expert layout instead of one tensor per expert."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mohawk_common.model_store import ModelSource, open_model
from mohawk_common.model_store.source import weights_nbytes
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.model.moe import SparseMoE
from mohawk_shard.model.weight_loading import build_stage
from mohawk_shard.node.capacity import measure_capacity

from .conftest import full_logits, reference_greedy, reference_logits

VARIANTS: dict[str, dict[str, Any]] = {
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3-moe": {
        "model_type": "qwen3_moe",
        "num_experts": 8,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 32,
        "norm_topk_prob": False,
        "head_dim": 16,
    },
    "qwen3-moe-dense-layers-fused": {
        "model_type": "qwen3_moe",
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 48,
        "norm_topk_prob": True,
        "mlp_only_layers": [1],
        "decoder_sparse_step": 3,  # layer 2 sparse, 0, 1 and 3 dense
        "head_dim": 16,
        "fused": True,
    },
}


def build_tiny(kind: str, directory: Path, tokenizer: Any, options: dict[str, Any] | None = None) -> Any:
    """A random-weight model of variant `kind` (or of `options`) saved to `directory`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    options = dict(VARIANTS[kind] if options is None else options)
    model_type = options.pop("model_type")
    fused = options.pop("fused", False)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=0,
        **options,
    )
    torch.manual_seed(sum(map(ord, kind)))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():  # random init is tiny; widen it so tokens (and routes) depend on the input
        for param in model.parameters():
            param.mul_(4.0) if param.dim() > 1 else param.add_(torch.randn_like(param) * 0.1)
    model.generation_config.eos_token_id = None  # the reference never stops early; ours runs with ignore_eos
    model.generation_config.pad_token_id = 0
    model.save_pretrained(directory, safe_serialization=True, save_original_format=not fused)
    tokenizer.save_pretrained(directory)
    return model


@pytest.fixture(scope="module", params=list(VARIANTS))
def tiny(
    request: pytest.FixtureRequest, bundled: ModelSource, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ModelSource, Any]:
    directory = tmp_path_factory.mktemp(request.param)
    model = build_tiny(request.param, directory, bundled.load_tokenizer())
    return open_model(directory), model


def test_logits_whole_and_split(tiny: tuple[ModelSource, Any]) -> None:
    source, model = tiny
    prompt = [5, 900, 17, 4000, 33, 2, 777, 12345, 8, 9, 10, 11, 40000, 3, 64, 65, 66, 67, 100]
    theirs = reference_logits(model, prompt)
    for split in [(), (2,)]:
        ours = full_logits(source, prompt, split, block_size=4)
        diff = (ours - theirs).abs().max().item()
        assert diff < 1e-4 * max(1.0, theirs.abs().max().item()), (split, diff)


def test_stage_holds_every_expert(tiny: tuple[ModelSource, Any]) -> None:
    """What a MoE layer holds, what the source reads for it, what the config and the node's
    heartbeat count: every expert and the router, the same bytes."""
    source = tiny[0]
    config = source.config
    layer = 2  # a MoE layer in every variant, neither end
    stage, _ = build_stage(
        source, layer, layer + 1, device=torch.device("cpu"), dtype=torch.float32, weights="fp32"
    )
    moe = stage.layers[0].mlp
    assert isinstance(moe, SparseMoE)
    held = sum(t.numel() * t.element_size() for t in stage.parameters())
    read = weights_nbytes(source.load_weights(layer, layer + 1, embedding=False, head=False))
    assert held == read == config.layer_weight_bytes(layer) == config.weight_bytes_per_layer
    experts = config.num_experts * 3 * config.hidden_size * config.moe_intermediate_size
    assert sum(p.numel() for p in moe.experts.parameters()) == experts
    capacity = measure_capacity(
        source,
        device="cpu",
        dtype="float32",
        weights="fp32",
        block_size=4,
        memory_limit_mb=None,
        kv_cache_memory_mb=None,
    )
    assert capacity.layer_weight_bytes == config.weight_bytes_per_layer  # a MoE layer, measured
    dense = [i for i in range(config.num_layers) if not config.is_moe_layer(i)]
    for layer in dense:  # a dense layer of a MoE model holds its own MLP only
        stored = weights_nbytes(source.load_weights(layer, layer + 1, embedding=False, head=False))
        assert stored == config.layer_weight_bytes(layer) < config.weight_bytes_per_layer


@pytest.mark.slow
def test_greedy_batched_matches_generate(tiny: tuple[ModelSource, Any], engine_factory: Any) -> None:
    source, model = tiny
    prompts = [[1, 2, 3, 4, 5], [300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311, 312], [42]]
    engine = engine_factory(
        split=(2,), source=source, block_size=4, num_kv_blocks=64, max_num_batched_tokens=8
    )
    got = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    for prompt, completion in zip(prompts, got, strict=True):
        assert completion.token_ids == reference_greedy(model, prompt, 12, eos=None)
