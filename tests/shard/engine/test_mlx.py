"""The MLX backend (mlx-lm's model classes over our paged KV cache) against torch and transformers:
logits of every architecture variant, and greedy text of MLX-only and torch/MLX/torch pipelines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mohawk_common.chat import encode_chat
from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.engine.sampling_params import SamplingParams

from .conftest import full_logits, reference_logits
from .test_architectures import VARIANTS, build_tiny

pytest.importorskip("mlx_lm", reason="the mlx extra (mlx, mlx-cpu, mlx-lm) is not installed")

PROMPT = [5, 900, 17, 4000, 33, 2, 777, 12345, 8, 9, 10, 11, 40000, 3, 64, 65, 66, 67, 100]
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colours.",
    "Explain gravity in one sentence.",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
PIPELINES = {"mlx,mlx": ((15,), ("mlx", "mlx")), "torch,mlx,torch": ((10, 20), ("torch", "mlx", "torch"))}


@pytest.fixture(scope="module", params=list(VARIANTS))
def tiny(
    request: pytest.FixtureRequest, bundled: ModelSource, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ModelSource, Any]:
    directory: Path = tmp_path_factory.mktemp(f"mlx-{request.param}")
    model = build_tiny(request.param, directory, bundled.load_tokenizer())
    return open_model(directory), model


@pytest.mark.parametrize("backends", [("mlx", "mlx"), ("torch", "mlx", "torch"), ("mlx", "torch", "mlx")])
def test_mlx_stages_match_transformers_on_every_architecture(
    tiny: tuple[ModelSource, Any], backends: tuple[str, ...]
) -> None:
    source, model = tiny
    theirs = reference_logits(model, PROMPT)
    split = (2,) if len(backends) == 2 else (1, 3)
    ours = full_logits(source, PROMPT, split, block_size=4, backends=backends)
    diff = (ours - theirs).abs().max().item()
    print(f"{'/'.join(backends)}: max |logit difference| {diff:.2e}")
    assert diff < 1e-3 * max(1.0, theirs.abs().max().item()), diff


def test_bundled_model_logits_through_mixed_pipelines(bundled: ModelSource) -> None:
    ids = bundled.load_tokenizer()("The capital of France is a city called")["input_ids"]
    torch_only = full_logits(bundled, ids)
    for name, (split, backends) in PIPELINES.items():
        diff = (full_logits(bundled, ids, split, backends=backends) - torch_only).abs().max().item()
        print(f"bundled SmolLM2-135M, {name}: max |logit difference| vs torch {diff:.2e}")
        assert diff < 1e-3, (name, diff)


@pytest.fixture(scope="module")
def chats(bundled: ModelSource, engine_factory: Any) -> tuple[list[list[int]], list[str]]:
    """Chat prompts sharing a system prompt (so prefix blocks are shared) and the torch engine's texts."""
    tokenizer = bundled.load_tokenizer()
    system = {"role": "system", "content": "You are a careful assistant who answers briefly. " * 4}
    prompts = [encode_chat(tokenizer, [system, {"role": "user", "content": q}]) for q in QUESTIONS]
    # torch and MLX compute with different kernels: their texts agree token for token in fp32
    expected = [c.text for c in engine_factory(weights="fp32").generate(prompts, GREEDY)]
    assert all(len(text) > 10 for text in expected)
    return prompts, expected


# MLX alone (34 s here: the mlx-cpu wheel decodes slowly) is a long-form case; `make test` keeps the
# mixed pipeline, which crosses both backends' boundaries
@pytest.mark.parametrize(
    "pipeline", [pytest.param("mlx,mlx", marks=pytest.mark.full_form), "torch,mlx,torch"]
)
def test_greedy_text_equals_the_torch_engine(
    chats: tuple[list[list[int]], list[str]], engine_factory: Any, pipeline: str
) -> None:
    """Batched with chunked prefill, prompts that share a prefix (prefix blocks reused), and one
    request cancelled midway: every other text equals the single-process torch engine's."""
    prompts, expected = chats
    split, backends = PIPELINES[pipeline]
    engine = engine_factory(split=split, backends=backends, max_num_batched_tokens=48, weights="fp32")
    engine.add_request("doomed", prompts[0], SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert engine.abort_request("doomed")
    assert [c.text for c in engine.generate(prompts, GREEDY)] == expected


def test_a_sliding_window_model_runs_masked_on_mlx(
    bundled: ModelSource, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mlx-lm's llama attends to the whole context; an MLX stage masks a Mistral's window itself
    (it used to refuse such a model), so past the window it answers as transformers does.
    Decode past the window over freed blocks: tests/shard/engine/test_mlx_architectures.py."""
    windowed = dict(VARIANTS["mistral-gqa2"], sliding_window=5)
    monkeypatch.setitem(VARIANTS, "mistral-window5", windowed)
    model = build_tiny("mistral-window5", tmp_path, bundled.load_tokenizer())
    source = open_model(tmp_path)
    assert source.config.sliding_window == 5 < len(PROMPT)
    theirs = reference_logits(model, PROMPT)
    ours = full_logits(source, PROMPT, (1, 3), block_size=4, backends=("torch", "mlx", "torch"))
    assert (ours - theirs).abs().max().item() < 1e-4 * max(1.0, theirs.abs().max().item())
