"""Architecture variants on tiny random-weight models built here (no download), against transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.engine.sampling_params import SamplingParams

from .conftest import full_logits, reference_greedy, reference_logits

VARIANTS: dict[str, dict[str, Any]] = {
    "llama-gqa4-tied": {
        "model_type": "llama",
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "llama-mha-untied": {
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
    "llama3-rope-scaling": {
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "mistral-gqa2": {
        "model_type": "mistral",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "sliding_window": None,
    },
    "qwen2-biases": {
        "model_type": "qwen2",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "qwen3-qk-norm": {
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
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
        **options,
    )
    torch.manual_seed(sum(map(ord, kind)))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # random init is tiny; widen it so tokens depend on the input
        for param in model.parameters():
            param.mul_(4.0) if param.dim() > 1 else param.add_(torch.randn_like(param) * 0.1)
    model.generation_config.eos_token_id = None  # the reference never stops early; ours runs with ignore_eos
    model.generation_config.pad_token_id = 0
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return model


def tiny_source(tmp_path_factory: pytest.TempPathFactory, kind: str = "llama-gqa4-tied") -> ModelSource:
    """A tiny random-weight model of `kind` in a fresh directory, opened (what a module-scoped
    fixture of another test file returns)."""
    directory = tmp_path_factory.mktemp(kind)
    build_tiny(kind, directory, open_model(None).load_tokenizer())
    return open_model(directory)


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
        assert diff < 1e-3 * max(1.0, theirs.abs().max().item()), (split, diff)


def test_greedy_batched_matches_generate(tiny: tuple[ModelSource, Any], engine_factory: Any) -> None:
    source, model = tiny
    prompts = [[1, 2, 3, 4, 5], [300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311, 312], [42]]
    engine = engine_factory(
        split=(2,), source=source, block_size=4, num_kv_blocks=64, max_num_batched_tokens=8
    )
    got = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    for prompt, completion in zip(prompts, got, strict=True):
        assert completion.token_ids == reference_greedy(model, prompt, 12, eos=None)
