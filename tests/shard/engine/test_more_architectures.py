"""Phi-3, Gemma 2, Gemma 3 text and a windowed Mistral on tiny random-weight models built here
(no download), against transformers: fp32 logits whole and split over three stages, and greedy
tokens through the engine (chunked prefill, batched decode, two stages). The sliding windows are
shorter than the prompts, so both prefill and decode attend past them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.engine.sampling_params import SamplingParams

from .conftest import full_logits, reference_greedy, reference_logits

ROTARY_HALF = 8  # rotary dims / 2 of the Phi variants (head_dim 32, partial rotary 0.5)

VARIANTS: dict[str, dict[str, Any]] = {
    "mistral-sliding-window": {
        "model_type": "mistral",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "sliding_window": 5,
    },
    "phi3-default-rope": {
        "model_type": "phi3",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
    },
    "phi4-partial-rotary-longrope": {
        "model_type": "phi3",
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "tie_word_embeddings": True,
        "original_max_position_embeddings": 64,
        "rope_parameters": {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "short_factor": [1.0 + 0.25 * i for i in range(ROTARY_HALF)],
            "long_factor": [2.0 + i for i in range(ROTARY_HALF)],
            "original_max_position_embeddings": 64,
        },
    },
    "gemma2-softcap-window": {
        "model_type": "gemma2",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "query_pre_attn_scalar": 24,
        "sliding_window": 6,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    "gemma3-qk-norm-two-bases": {
        "model_type": "gemma3_text",
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
        },
    },
}


def build_tiny(kind: str, directory: Path, tokenizer: Any) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    options = dict(VARIANTS[kind])
    model_type = options.pop("model_type")
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=0,
        **options,
    )
    torch.manual_seed(sum(map(ord, kind)))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():  # random init is tiny; widen it so tokens depend on the input
        for param in model.parameters():
            param.mul_(4.0) if param.dim() > 1 else param.add_(torch.randn_like(param) * 0.1)
    model.generation_config.eos_token_id = None  # the reference never stops early; ours runs with ignore_eos
    model.generation_config.pad_token_id = 0
    model.save_pretrained(directory, safe_serialization=True)
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
    for split in [(), (1, 3)]:
        ours = full_logits(source, prompt, split, block_size=4)
        diff = (ours - theirs).abs().max().item()
        assert diff < 1e-4 * max(1.0, theirs.abs().max().item()), (split, diff)


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
