"""MLX stages for every architecture past the Llama family (Phi-3/4, Gemma 2, Gemma 3 text,
Mixtral, Qwen3-MoE), on the tiny random-weight models of the torch tests, against transformers:
fp32 logits of a torch,mlx,torch split within 1e-4, windows shorter than the prompt (so a
sliding layer's mask and its freed blocks matter), decode steps past the window through the
paged cache, and a quantized GGUF on an MLX stage against the same file on torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mohawk_common.kv_groups import NULL_BLOCK, model_kv_groups
from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.backends import make_backend
from mohawk_shard.model.forward_batch import ForwardBatch

from . import test_gguf_architectures as gguf
from . import test_moe_architectures as moe
from . import test_more_architectures as more
from .conftest import full_logits, reference_greedy, reference_logits

pytest.importorskip("mlx_lm", reason="the mlx extra (mlx, mlx-cpu, mlx-lm) is not installed")

PROMPT = [5, 900, 17, 4000, 33, 2, 777, 12345, 8, 9, 10, 11, 40000, 3, 64, 65, 66, 67, 100]
# variant -> the module whose `VARIANTS`/`build_tiny` make it
TINY = {
    "phi3-default-rope": more,
    "phi4-partial-rotary-longrope": more,
    "gemma2-softcap-window": more,
    "gemma3-qk-norm-two-bases": more,
    "mistral-sliding-window": more,
    "mixtral": moe,
    "qwen3-moe": moe,
    "qwen3-moe-dense-layers-fused": moe,
}


@pytest.fixture(scope="module", params=list(TINY))
def tiny(
    request: pytest.FixtureRequest, bundled: ModelSource, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ModelSource, Any]:
    directory: Path = tmp_path_factory.mktemp(f"mlx-{request.param}")
    model = TINY[request.param].build_tiny(request.param, directory, bundled.load_tokenizer())
    return open_model(directory), model


def test_torch_mlx_torch_logits_match_transformers(tiny: tuple[ModelSource, Any]) -> None:
    """MLX holds the middle layers; blocks of 4 so the windows (5, 6) span several of them."""
    source, model = tiny
    theirs = reference_logits(model, PROMPT)
    ours = full_logits(source, PROMPT, (1, 3), block_size=4, backends=("torch", "mlx", "torch"))
    diff = (ours - theirs).abs().max().item()
    print(f"{source.config.architecture}: max |logit difference| {diff:.2e}")
    assert diff < 1e-4 * max(1.0, theirs.abs().max().item()), diff


def test_an_all_mlx_pipeline_matches_transformers(tiny: tuple[ModelSource, Any]) -> None:
    """Stage 0 (embedding, Gemma's sqrt(hidden) scale) and the last (final norm, soft-cap) on MLX."""
    source, model = tiny
    theirs = reference_logits(model, PROMPT)
    ours = full_logits(source, PROMPT, (2,), block_size=4, backends=("mlx", "mlx"))
    assert (ours - theirs).abs().max().item() < 1e-4 * max(1.0, theirs.abs().max().item())


def test_greedy_tokens_through_the_engine_with_an_mlx_last_stage(
    tiny: tuple[ModelSource, Any], engine_factory: Any
) -> None:
    """The engine's own steps (chunked prefill, batched decode of two sequences) with MLX holding
    the last layers, the head and sampling: transformers' greedy tokens."""
    from mohawk_shard.engine.sampling_params import SamplingParams

    source, model = tiny
    engine = engine_factory(
        split=(1,), source=source, backends=("torch", "mlx"), block_size=4, max_num_batched_tokens=8
    )
    prompts = [PROMPT, PROMPT[3:11]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    got: dict[str, list[int]] = {"r0": [], "r1": []}
    for event in engine.run():
        if event.token_id is not None:
            got[event.request_id].append(event.token_id)
    for i, prompt in enumerate(prompts):
        assert got[f"r{i}"] == reference_greedy(model, prompt, 12, eos=None), i


def _decode_past_the_window(source: ModelSource, backend_name: str, block_size: int = 4) -> torch.Tensor:
    """Prefill 9 tokens, then decode 10 one at a time as the block manager would run them: a
    sliding group's blocks wholly behind its window are given back (`NULL_BLOCK`) and their ids
    reused by the next blocks, so a stage that read them would read another position's KV."""
    config = source.config
    groups = model_kv_groups(config)
    backend = make_backend(
        backend_name, source, 0, config.num_layers, device="cpu", dtype="float32", kv_cache_dtype="float32"
    )
    backend.allocate_kv_cache(64, block_size)
    tables: list[list[int]] = [[] for _ in groups]
    free = list(range(64))
    rows = []
    position, chunk = 0, PROMPT[:9]
    while True:
        end = position + len(chunk)
        for table in tables:
            while len(table) * block_size < end:
                table.append(free.pop(0))
        batch = ForwardBatch.build(
            [(chunk, position, tables[0], True)], block_size, group_tables=[tables[1:]]
        )
        logits = backend.forward(batch, None)
        rows.append((logits if isinstance(logits, torch.Tensor) else torch.from_numpy(np.array(logits)))[-1])
        position = end
        for group, table in zip(groups, tables, strict=True):  # give back what no later query reads
            for index in range(group.first_needed_block(position, block_size)):
                if table[index] != NULL_BLOCK:
                    free.append(table[index])
                    table[index] = NULL_BLOCK
        if position == len(PROMPT):
            return torch.stack(rows)
        chunk = [PROMPT[position]]


@pytest.mark.parametrize(
    "kind", ["gemma2-softcap-window", "gemma3-qk-norm-two-bases", "mistral-sliding-window"]
)
def test_decode_past_the_window_with_freed_blocks(kind: str, bundled: ModelSource, tmp_path: Path) -> None:
    model = more.build_tiny(kind, tmp_path, bundled.load_tokenizer())
    source = open_model(tmp_path)
    assert source.config.sliding_window is not None and source.config.sliding_window < len(PROMPT) - 9
    theirs = reference_logits(model, PROMPT)[8:]
    ours = _decode_past_the_window(source, "mlx")
    assert (ours - _decode_past_the_window(source, "torch")).abs().max().item() < 1e-4
    assert (ours - theirs).abs().max().item() < 1e-4 * max(1.0, theirs.abs().max().item())


def test_quantized_gguf_on_mlx_stages_matches_torch(tmp_path: Path) -> None:
    """Gemma 3's file with Q4_K, Q5_0 and Q8_0 tensors (and a Q4_K tied embedding): MLX stages
    hold them as the file's own groups, exact with float32 scales, where torch in fp32 computes
    with the weights dequantized; the same weights, so the logits agree to float rounding (1e-4 of
    the largest). (A torch stage's own native 4-bit path runs bf16 activations: not compared here.)"""
    source, _ = gguf.write_tiny_gguf("gemma3", tmp_path, native=True)
    from mohawk_shard.backends.mlx_backend import MlxBackend

    stage = MlxBackend(source, 0, 1, device="cpu")
    assert type(stage.layers[0].mlp.gate_proj).__name__ == "QuantizedLinear"  # Q4_K, held 4-bit
    assert type(stage.embed_tokens).__name__ == "QuantizedEmbedding"
    theirs = full_logits(source, gguf.PROMPT, (2, 4), block_size=4)
    ours = full_logits(source, gguf.PROMPT, (2, 4), block_size=4, backends=("mlx",) * 3, weights="native")
    diff = (ours - theirs).abs().max().item()
    print(f"gemma3 GGUF Q4_K/Q5_0/Q8_0 on mlx,mlx,mlx vs torch fp32: {diff:.2e}")
    assert diff < 1e-4 * max(1.0, theirs.abs().max().item()), diff


@pytest.mark.parametrize(
    ("stored", "dtype", "exact"),
    [
        ("Q4_K", "float32", True),
        ("Q4_K", "float16", False),
        ("Q4_0", "float16", True),
        ("Q4_1", "bfloat16", False),
    ],
)
def test_groups_stay_in_their_bits_and_rounded_scales_are_said(stored: str, dtype: str, exact: bool) -> None:
    """Q4_K's scales d·sc are fp16 × 6-bit (17 significant bits): exact in float32 only; Q4_0's d
    is fp16 (11 bits): exact in float16 too, never in bfloat16 (8). Held 4-bit in every dtype; where
    the dtype rounds the scales, `scale_rounding` says so."""
    from mohawk_shard.backends.mlx_quant import held_bits, scale_rounding

    assert held_bits("layers.0.mlp.up_proj.weight", stored, 256, "native") == (4, None)
    note = scale_rounding(stored, dtype)
    assert (note is None) == exact
    if note is not None:
        assert stored in note and dtype in note


def test_a_bfloat16_stage_holds_the_files_4_bit_groups(bundled: ModelSource) -> None:
    """The bundled Q4_1 file's layers on a bfloat16 MLX stage: 4-bit groups with bf16 scales and
    biases (5 bits a weight), not a dequantized bf16 copy (16 bits a weight)."""
    from mohawk_shard.backends import make_backend

    def held(weights: str) -> int:
        return make_backend(
            "mlx", bundled, 1, 3, device="cpu", dtype="bfloat16", weights=weights
        ).weight_bytes

    ratio = held("native") / held("bf16")
    assert 0.3 < ratio < 0.35, ratio
