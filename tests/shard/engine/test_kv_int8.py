"""Two-tier KV cache (recent blocks in the compute dtype, older ones int8) and the batch-1 context view."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.backends import make_backend
from mohawk_shard.backends import torch_backend as torch_backend_module
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.engine.backend import Backend
from mohawk_shard.engine.kv_tiers import num_cold_blocks
from mohawk_shard.engine.llm_engine import LLMEngine
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.model.attention_metadata import AttentionMetadata, AttentionPart
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.kv_cache import dequantize, quantize_blocks

from .test_architectures import build_tiny

Step = tuple[list[int], int]  # (token ids, start position) of one sequence


def test_quantize_round_trip_is_within_half_a_step() -> None:
    torch.manual_seed(0)
    blocks = torch.randn(5, 4, 3, 8) * torch.tensor([1.0, 10.0, 0.01])[None, None, :, None]
    quantized, scale = quantize_blocks(blocks)
    assert quantized.dtype == torch.int8 and scale.shape == (5, 3)
    back = dequantize(quantized, scale[:, None, :].expand(5, 4, 3), torch.float32)
    assert ((back - blocks).abs() <= scale[:, None, :, None] / 2 + 1e-6).all()


def test_context_is_a_view_only_for_one_sequence_on_consecutive_blocks(bundled: ModelSource) -> None:
    backend = make_backend("torch", bundled, 0, 1, device="cpu", dtype="float32")
    assert isinstance(backend, TorchBackend)

    def meta(tables: list[list[int]]) -> AttentionPart:
        chunks = [([1], 20, table, True) for table in tables]
        built = AttentionMetadata.build(ForwardBatch.build(chunks, 8), backend.rotary, torch.device("cpu"))
        return built.parts[0]

    consecutive = meta([[3, 4, 5]])
    assert consecutive.context_range == (24, 21) and consecutive.context_slots is None
    assert meta([[3, 5, 4]]).context_range is None
    assert meta([[3, 4, 5], [6, 7, 8]]).context_range is None


def run_steps(
    backend: Backend, steps: list[list[Step]], tables: list[list[int]], block_size: int
) -> list[Any]:
    """Logits of every step; step `i` runs one (tokens, start) chunk per sequence, in table order."""
    logits = []
    for step in steps:
        chunks = [(tokens, start, tables[row], True) for row, (tokens, start) in enumerate(step)]
        logits.append(backend.forward(ForwardBatch.build(chunks, block_size), None))
    return logits


def script(prompts: list[list[int]], chunk: int, num_decode: int) -> list[list[Step]]:
    """Chunked prefill of every prompt side by side, then `num_decode` decode steps (fixed tokens)."""
    steps: list[list[Step]] = []
    for start in range(0, max(map(len, prompts)), chunk):
        steps.append([(p[start : start + chunk] or p[-1:], min(start, len(p) - 1)) for p in prompts])
    ends = [len(p) for p in prompts]
    for i in range(num_decode):
        steps.append([([(7 * i + row) % 500 + 1], ends[row] + i) for row in range(len(prompts))])
    return steps


def compare(source: ModelSource, steps: list[list[Step]], tables: list[list[int]], block_size: int) -> float:
    """Largest logit difference, int8 KV against compute-dtype KV, relative to the largest logit."""
    results = []
    for kv in ("auto", "int8"):
        backend = make_backend(  # fp32 weights: the difference measured is the KV tier's alone
            "torch",
            source,
            0,
            source.config.num_layers,
            device="cpu",
            dtype="float32",
            weights="fp32",
            kv_cache_dtype=kv,
        )
        backend.allocate_kv_cache(max(map(max, tables)) + 1, block_size)
        results.append(run_steps(backend, steps, tables, block_size))
    worst = 0.0
    for ours, theirs in zip(*results, strict=True):
        worst = max(worst, ((ours - theirs).abs().max() / theirs.abs().max()).item())
    return worst


@pytest.fixture(scope="module")
def tiny_source(bundled: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> ModelSource:
    directory: Path = tmp_path_factory.mktemp("kv-int8")
    build_tiny("llama-gqa4-tied", directory, bundled.load_tokenizer())
    return open_model(directory)


def test_tiny_model_int8_logits_stay_close(tiny_source: ModelSource) -> None:
    prompts = [list(range(100, 130)), list(range(900, 915))]
    tables = [[9, 2, 3, 4, 5, 6, 7, 8, 1, 0], [10, 11, 12, 13, 14, 15, 16]]  # out of order: gathers
    assert compare(tiny_source, script(prompts, 9, 10), tables, 4) < 0.03


def test_tiny_model_int8_under_hot_pool_pressure(
    tiny_source: ModelSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch_backend_module, "num_hot_blocks", lambda num_blocks: 5)
    prompts = [list(range(100, 130)), list(range(900, 915))]
    tables = [[9, 2, 3, 4, 5, 6, 7, 8, 1, 0], [10, 11, 12, 13, 14, 15, 16]]
    assert compare(tiny_source, script(prompts, 6, 10), tables, 4) < 0.03


def test_cold_blocks_follow_the_rule_as_a_sequence_grows(tiny_source: ModelSource) -> None:
    backend = make_backend("torch", tiny_source, 0, 4, device="cpu", dtype="float32", kv_cache_dtype="int8")
    assert isinstance(backend, TorchBackend)
    backend.allocate_kv_cache(16, 4)
    assert backend.kv_tiers is not None
    table, counts = list(range(16)), []
    backend.forward(ForwardBatch.build([(list(range(1, 11)), 0, table, True)], 4), None)
    counts.append(backend.kv_tiers.num_cold)
    for position in range(10, 30):
        backend.forward(ForwardBatch.build([([position], position, table, True)], 4), None)
        counts.append(backend.kv_tiers.num_cold)
    assert counts == [num_cold_blocks(n, 4) for n in range(10, 31)]
    assert counts[-1] == 5 and int((backend.kv_tiers.hot_of >= 0).sum()) == 3


def test_bundled_int8_logits_stay_close(bundled: ModelSource) -> None:
    tokenizer = bundled.load_tokenizer()
    text = (
        "The history of the city of Rome begins with its legendary founding by Romulus and Remus. "
        "Over the centuries it grew into the capital of an empire that spanned the Mediterranean, "
        "and its roads, laws and language shaped much of Europe. Tell me more about"
    )
    prompt = tokenizer.encode(text)
    assert compare(bundled, script([prompt], 32, 6), [list(range(8))], 16) < 0.05


def test_engine_counts_int8_blocks_like_its_backend(engine_factory: Callable[..., LLMEngine]) -> None:
    engine = engine_factory(kv_cache_dtype="int8", block_size=4, num_kv_blocks=64)
    backend = engine.stages[0].backend
    assert isinstance(backend, TorchBackend) and backend.kv_tiers is not None
    manager = engine.scheduler.block_manager
    prompt = list(range(200, 210))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    engine.generate([prompt], params)
    computed = len(prompt) + 12 - 1  # the last sampled token is never fed back
    assert manager.num_quantized_blocks == num_cold_blocks(computed, 4) == backend.kv_tiers.num_cold == 3
    assert manager.bytes_saved == 3 * backend.kv_tier_bytes(4).saved
    auto = engine_factory(block_size=4, num_kv_blocks=64).generate([prompt], params)
    int8 = engine.generate([prompt], params)
    assert int8[0].token_ids[:8] == auto[0].token_ids[:8]  # nonsense prompt: later near-ties may flip


def test_fp16_and_int8_fit_more_blocks_in_the_same_budget(bundled: ModelSource) -> None:
    """An fp32 CPU stage stores KV fp16 by default (twice fp32's blocks); int8 holds older blocks
    int8 beside an fp16 recent tier."""
    from mohawk_shard.config import EngineSettings
    from mohawk_shard.local import kv_block_count

    backends = {
        kv: make_backend("torch", bundled, 0, 30, device="cpu", dtype="float32", kv_cache_dtype=kv)
        for kv in ("float32", "auto", "int8")
    }
    counts = {
        kv: kv_block_count(EngineSettings(kv_cache_memory_mb=256, kv_cache_dtype=kv), [b])
        for kv, b in backends.items()
    }
    assert counts["float32"] == (256 << 20) // 737_280
    assert counts["auto"] == (256 << 20) // 368_640
    assert counts["int8"] == (256 << 20) // (185_040 + 46_080)
    assert counts["int8"] / counts["auto"] > 1.5
    backends["auto"].allocate_kv_cache(8, 16)
    assert {c.key.dtype for c in backends["auto"].kv_caches} == {torch.float16}
