"""Sliding windows in the paged KV cache, through the engine on tiny random-weight models built here:
a Mistral whose every layer slides (window 5) and a Gemma 2 whose layers alternate (window 6). Run
well past the window, a sliding layer's blocks go back to the pool (the pool is too small to hold the
sequences otherwise), and greedy tokens stay transformers' own, over two stages, with chunked
prefill, batched decode, prefix hits and preemption."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.engine.llm_engine import LLMEngine
from mohawk_shard.engine.sampling_params import SamplingParams

from .conftest import reference_greedy
from .test_more_architectures import build_tiny

BLOCK = 4
NEW_TOKENS = 28
HITS: list[int] = []
PROMPTS = [
    [5, 900, 17, 4000, 33, 2, 777, 12345, 8, 9, 10],
    [5, 900, 17, 4000, 33, 2, 777, 12345, 40, 41],
    [42],
]


@pytest.fixture(scope="module", params=["mistral-sliding-window", "gemma2-softcap-window"])
def tiny(
    request: pytest.FixtureRequest, bundled: ModelSource, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ModelSource, Any]:
    directory: Path = tmp_path_factory.mktemp(request.param)
    model = build_tiny(request.param, directory, bundled.load_tokenizer())
    return open_model(directory), model


def run_tracking_blocks(engine: LLMEngine, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Greedy tokens of `prompts`, and the most blocks in use at once (prefix hits go to `HITS`)."""
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    pool = engine.scheduler.block_manager
    lookup = pool.get_computed_blocks

    def noting_hits(seq: Any) -> list[int]:
        hits = lookup(seq)
        HITS.append(pool.num_hit_tokens(hits))
        return hits

    pool.get_computed_blocks = noting_hits  # type: ignore[method-assign]
    HITS.clear()
    peak = 0
    for event in engine.run():
        if event.token_id is not None:
            tokens[event.request_id].append(event.token_id)
        peak = max(peak, pool.num_blocks - pool.num_free_blocks)
    return [tokens[f"r{i}"] for i in range(len(prompts))], peak


def test_windows_free_blocks_and_tokens_match(tiny: tuple[ModelSource, Any], engine_factory: Any) -> None:
    source, model = tiny
    engine = engine_factory(
        split=(2,), source=source, block_size=BLOCK, num_kv_blocks=48, max_num_batched_tokens=8
    )
    pool = engine.scheduler.block_manager
    got, peak = run_tracking_blocks(engine, PROMPTS)
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        assert tokens == reference_greedy(model, prompt, NEW_TOKENS, eos=None)
    num_groups = pool.num_groups
    kept = sum(-(-(len(p) + NEW_TOKENS) // BLOCK) for p in PROMPTS) * num_groups  # without freeing
    assert pool.num_window_freed > 0 and peak < kept
    assert max(HITS) == 8  # the second prompt's first two blocks came from the first
    assert pool.num_free_blocks == pool.num_blocks  # and every block is back at the end
    if num_groups == 1:  # all layers slide: a decoding sequence holds at most 2 blocks of 4 (window 5)
        assert peak <= 3 * 2 + 2


def test_a_pool_smaller_than_one_sequence_without_windows(
    tiny: tuple[ModelSource, Any], engine_factory: Any
) -> None:
    """Mistral: 4 blocks of 4 hold 39-token sequences whose window is 5; three of them preempt one
    another in a pool that small, and their tokens stay exact."""
    source, model = tiny
    if "mistral" not in str(source.path):
        pytest.skip("the all-sliding model shows it; the alternating one keeps its full layers' blocks")
    engine = engine_factory(
        split=(2,), source=source, block_size=BLOCK, num_kv_blocks=4, max_num_batched_tokens=8
    )
    assert engine.max_model_len > 4 * BLOCK
    got, peak = run_tracking_blocks(engine, PROMPTS)
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        assert tokens == reference_greedy(model, prompt, NEW_TOKENS, eos=None)
    assert peak <= 4 and engine.scheduler.num_preemptions > 0


def test_an_mlx_last_stage_keeps_the_tokens_as_windows_free_blocks(
    tiny: tuple[ModelSource, Any], engine_factory: Any
) -> None:
    """The same run with an MLX stage holding the windowed last layers, the head and sampling: its
    sliding layers read only the blocks their window still holds, while freed ids are reused."""
    pytest.importorskip("mlx_lm", reason="the mlx extra (mlx, mlx-cpu, mlx-lm) is not installed")
    source, model = tiny
    engine = engine_factory(
        split=(2,),
        source=source,
        backends=("torch", "mlx"),
        block_size=BLOCK,
        num_kv_blocks=48,
        max_num_batched_tokens=8,
    )
    got, _ = run_tracking_blocks(engine, PROMPTS)
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        assert tokens == reference_greedy(model, prompt, NEW_TOKENS, eos=None)
    assert engine.scheduler.block_manager.num_window_freed > 0


def test_past_the_window_a_prompt_gets_the_same_bits_whatever_its_chunks(
    tiny: tuple[ModelSource, Any], engine_factory: Any
) -> None:
    """The default mode past the window: a sliding layer reads from the first block its window
    still holds, and fixed-chunk attention counts its chunks of 64 from there, so that start is
    kept on a multiple of 64 positions (blocks already given back read as masked slot 0). A prompt
    prefilled in one step, or 8 tokens a step while blocks behind the window go back, then decoded,
    gives the same log-probabilities bit for bit."""
    source, _ = tiny
    prompt = [(7 * i + 3) % 5000 + 10 for i in range(150)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    runs = [
        engine_factory(
            source=source, block_size=BLOCK, num_kv_blocks=128, max_num_batched_tokens=budget
        ).generate([prompt], params)[0]
        for budget in (512, 8)
    ]
    assert runs[1].token_ids == runs[0].token_ids
    assert runs[1].logprobs == runs[0].logprobs
