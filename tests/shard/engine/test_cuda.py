"""The CUDA path (bf16 and fp32) against transformers on CPU; skipped where torch sees no GPU.

Run on a GPU machine with `pytest tests/shard/engine/test_cuda.py`. Tiny random models are built here,
so nothing but torch and transformers is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.forward_batch import ForwardBatch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")

VARIANTS: dict[str, dict[str, Any]] = {
    "llama-gqa": {"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 2},
    "qwen2-bias": {"model_type": "qwen2", "num_attention_heads": 8, "num_key_value_heads": 2},
    "qwen3-qknorm": {
        "model_type": "qwen3",
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
    },
    "mixtral-moe": {
        "model_type": "mixtral",
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "qwen3-moe": {
        "model_type": "qwen3_moe",
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "num_experts": 8,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 128,
    },
}
BLOCK = 8


@pytest.fixture(scope="module", params=list(VARIANTS))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelSource, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM

    options = dict(VARIANTS[request.param])
    config = AutoConfig.for_model(
        options.pop("model_type"),
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        **options,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    directory: Path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory, safe_serialization=True)
    return open_model(directory), model


def run_stages(
    source: ModelSource, dtype: str, chunks: list[Any], steps: list[list[Any]]
) -> list[torch.Tensor]:
    """Run two stages ([0,2), [2,4)) on CUDA through successive batches; logits of every token row."""
    backends = [TorchBackend(source, a, b, device="cuda", dtype=dtype) for a, b in [(0, 2), (2, 4)]]
    for backend in backends:
        backend.allocate_kv_cache(64, BLOCK)
    out = []
    for step in [chunks, *steps]:
        batch = ForwardBatch.build(step, BLOCK, all_logits=True)
        hidden = None
        for backend in backends:
            hidden = backend.forward(batch, hidden)
        assert hidden is not None and hidden.device.type == "cuda"
        out.append(hidden.float().cpu())
    return out


def reference(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_and_mixed_batch_match_cpu_reference(tiny: tuple[ModelSource, Any], dtype: str) -> None:
    source, model = tiny
    a = [int(t) for t in torch.randint(0, 512, (21,), generator=torch.Generator().manual_seed(1))]
    b = [int(t) for t in torch.randint(0, 512, (13,), generator=torch.Generator().manual_seed(2))]
    # step 1: a's prompt alone; step 2: a decodes one token while b prefills in the same batch
    first, second = run_stages(
        source, dtype, [(a[:-1], 0, [0, 1, 2], True)], [[(a[-1:], 20, [0, 1, 2], True), (b, 0, [3, 4], True)]]
    )
    ref_a, ref_b = reference(model, a), reference(model, b)
    ours = [(first, ref_a[:-1]), (second[:1], ref_a[-1:]), (second[1:], ref_b)]
    tolerance = 1e-3 if dtype == "float32" else 0.08
    scale = ref_a.abs().max().item()
    for got, want in ours:
        diff = (got - want).abs().max().item()
        assert diff <= tolerance * scale, (dtype, diff, scale)
        agreement = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
        assert agreement >= (1.0 if dtype == "float32" else 0.8), agreement
