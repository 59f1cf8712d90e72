"""In the default mode (native 4-bit weights, `batch_invariant` on) a prompt's greedy tokens do not
depend on what else runs: alone, among 31 others of mixed lengths, with its prompt cut into other
chunks, after a prefix-cache hit, and resumed from half its answer as stage 0 resumes it after a
failover. `python bench/batch_invariance.py` is the long form (64 tokens, and the cost)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mohawk_common.chat import encode_chat
from mohawk_common.model_store import ModelSource
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.llm_engine import LLMEngine
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.local import build_local_engine
from tests.shard.torch_kernels import choose

TOKENS = 24
TOPICS = ["the moon", "bread", "rivers", "chess", "volcanoes", "owls", "jazz", "glaciers"]


def prompts(source: ModelSource, count: int, offset: int = 0) -> list[list[int]]:
    """Chat prompts of 36 to a few hundred tokens, sharing the template's prefix."""
    tokenizer = source.load_tokenizer()
    out = []
    for i in range(offset, offset + count):
        detail = " Explain every step and give examples." * (i % 7) ** 2
        text = f"Tell me {'a fact' if i % 2 else 'a story'} about {TOPICS[i % len(TOPICS)]}.{detail}"
        out.append(encode_chat(tokenizer, [{"role": "user", "content": text}]))
    return out


def engine(bundled: ModelSource, **settings: Any) -> LLMEngine:
    """The defaults: nothing pinned but a small KV pool and the thread count."""
    return build_local_engine(EngineSettings(num_threads=2, num_kv_blocks=1024, **settings), source=bundled)


def generate(engine: LLMEngine, batch: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    return [c.token_ids for c in engine.generate(batch, params)]


def resume(engine: LLMEngine, prompt: list[int], emitted: list[int]) -> list[int]:
    """The tokens after `emitted` of a request queued with them as already emitted (what a new
    stage 0 does with a request whose stage died): prompt and `emitted` re-prefilled, then decoded."""
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS - len(emitted), ignore_eos=True)
    seq = engine.core.add_request("resumed", prompt, params, output_token_ids=emitted)
    engine.emitter.track(seq.seq_id, "resumed", params, seq.num_prompt_tokens, engine.core.prompt_tail(seq))
    return [event.token_id for event in engine.run() if event.token_id is not None]


@pytest.fixture(scope="module")
def six(bundled: ModelSource) -> list[list[int]]:
    six = prompts(bundled, 6)
    assert sorted(len(p) for p in six) == [len(p) for p in six] and len(six[-1]) > 200
    return six


@pytest.fixture(scope="module")
def alone(bundled: ModelSource, six: list[list[int]]) -> list[list[int]]:
    """Each prompt alone, each on a fresh engine (no prefix cache to share)."""
    return [generate(engine(bundled), [p])[0] for p in six]


def test_the_default_mode_is_batch_invariant() -> None:
    settings = EngineSettings()
    assert settings.batch_invariant and settings.weights == "native"


def test_in_a_batch_of_32_of_mixed_lengths(
    bundled: ModelSource, six: list[list[int]], alone: list[list[int]]
) -> None:
    # the six among 26 others, all admitted together: chunks cut by load, decode steps of up to 32
    # rows, prefix-cache hits on the shared template
    assert generate(engine(bundled), six + prompts(bundled, 26, offset=6))[:6] == alone


def test_with_another_chunk_size_and_after_a_prefix_hit(
    bundled: ModelSource, six: list[list[int]], alone: list[list[int]]
) -> None:
    small_chunks = engine(bundled, max_num_batched_tokens=48)
    assert generate(small_chunks, six) == alone
    # the same engine again: each prompt's prefix now comes from the cache, computed in other steps
    assert [generate(small_chunks, [p])[0] for p in six] == alone


def test_resumed_from_half_its_answer(
    bundled: ModelSource, six: list[list[int]], alone: list[list[int]]
) -> None:
    fresh = engine(bundled)
    cut = TOKENS // 2
    assert [resume(fresh, p, ref[:cut]) for p, ref in zip(six, alone, strict=True)] == [
        ref[cut:] for ref in alone
    ]


@pytest.mark.slow
def test_on_torchs_own_kernels_too(bundled: ModelSource, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without the compiled CPU kernels (tinygemm, torch-op attention, F.rms_norm) keeps
    the promise with its own arithmetic: alone, in a batch of 32, in other chunks."""
    choose(monkeypatch, "torch")
    three = prompts(bundled, 3)
    on_torch = engine(bundled)
    assert not any(getattr(m, "row_kernel", False) for m in on_torch.stages[0].backend.model.modules())
    alone = [generate(engine(bundled), [p])[0] for p in three]
    assert generate(on_torch, three + prompts(bundled, 29, offset=3))[:3] == alone
    assert generate(engine(bundled, max_num_batched_tokens=48), three) == alone


def test_on_one_thread_and_on_two(bundled: ModelSource, six: list[list[int]], alone: list[list[int]]) -> None:
    """Shard nodes sharing a host's cores change their thread count from step to step
    (`node/host_cores.py`): the tokens must not depend on it."""
    threads = torch.get_num_threads()
    one = engine(bundled)
    try:
        torch.set_num_threads(1)
        assert generate(one, six[:3]) == alone[:3]
    finally:
        torch.set_num_threads(threads)
