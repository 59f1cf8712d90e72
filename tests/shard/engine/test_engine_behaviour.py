"""What a user of the engine relies on: preemption, cancellation, prefix reuse, stops, logprobs, seeds."""

from __future__ import annotations

from typing import Any

import pytest

from mohawk_common.chat import encode_chat
from mohawk_common.errors import InvalidRequestError
from mohawk_common.model_store import ModelSource
from mohawk_shard.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=40)


@pytest.fixture(scope="module")
def prompts(bundled: ModelSource) -> list[list[int]]:
    tokenizer = bundled.load_tokenizer()
    questions = ["Name three rivers in Europe.", "What do bees make?", "Describe a cat.", "Why do we sleep?"]
    return [encode_chat(tokenizer, [{"role": "user", "content": q}]) for q in questions]


def test_preemption_by_recompute_keeps_outputs_identical(
    engine_factory: Any, prompts: list[list[int]]
) -> None:
    alone = [engine_factory().generate([p], GREEDY)[0].token_ids for p in prompts]
    tight = engine_factory(num_kv_blocks=14, block_size=16)  # 224 slots for 4 × ~80 tokens
    together = tight.generate(prompts, GREEDY)
    assert tight.scheduler.num_preemptions > 0
    assert [c.token_ids for c in together] == alone
    assert tight.scheduler.block_manager.num_free_blocks == 14


def test_cancel_frees_blocks_at_once_and_others_continue(
    engine_factory: Any, prompts: list[list[int]]
) -> None:
    engine = engine_factory(num_kv_blocks=64, enable_prefix_caching=False)
    blocks = engine.scheduler.block_manager
    engine.add_request("keep", prompts[0], GREEDY)
    engine.add_request("drop", prompts[1], SamplingParams(temperature=0.0, max_tokens=500))
    for _ in range(3):
        engine.step()
    free_before = blocks.num_free_blocks
    assert engine.abort_request("drop")
    assert blocks.num_free_blocks > free_before
    assert not engine.abort_request("drop")
    events = list(engine.run())
    assert {e.request_id for e in events} == {"keep"}
    assert events[-1].finish_reason in {"stop", "length"}
    assert blocks.num_free_blocks == 64
    assert all(stage.num_sequences == 0 for stage in engine.stages)  # every stage dropped both


def test_shared_prefix_computed_once_same_answer(bundled: ModelSource, engine_factory: Any) -> None:
    tokenizer = bundled.load_tokenizer()
    system = {"role": "system", "content": "You are a careful assistant. " * 12}
    first = encode_chat(tokenizer, [system, {"role": "user", "content": "What is 2 + 2?"}])
    second = encode_chat(tokenizer, [system, {"role": "user", "content": "Name a color."}])
    cached = engine_factory()
    cached.generate([first], GREEDY)
    cached.add_request("second", second, GREEDY)
    events = cached.step()
    (seq,) = cached.scheduler.running
    num_cached = seq.num_cached_tokens
    assert num_cached >= 64  # the shared system prompt's full blocks were not recomputed
    events += list(cached.run())
    reused = [e.token_id for e in events]
    assert events[-1].num_cached_tokens == num_cached  # usage reports what the cache served
    fresh = engine_factory(enable_prefix_caching=False).generate([second], GREEDY)[0].token_ids
    assert reused == fresh


def test_stop_string_max_tokens_and_finish_reasons(engine_factory: Any, prompts: list[list[int]]) -> None:
    engine = engine_factory()
    free = engine.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    assert len(free.token_ids) == 12 and free.finish_reason == "length"
    stop = free.text[5:9]
    stopped = engine.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=12, stop=[stop]))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[: free.text.index(stop)]


def test_logprobs_with_alternatives(engine_factory: Any, prompts: list[list[int]]) -> None:
    result = engine_factory().generate(
        [prompts[1]], SamplingParams(temperature=0.0, max_tokens=6, logprobs=3)
    )[0]
    for token_id, logprob, top in zip(result.token_ids, result.logprobs, result.top_logprobs, strict=True):
        assert len(top) == 3 and top[0][0] == token_id and logprob == pytest.approx(top[0][1])
        assert top[0][1] >= top[1][1] >= top[2][1] and logprob is not None and logprob <= 0


def test_same_seed_same_text_alone_or_in_a_batch(engine_factory: Any, prompts: list[list[int]]) -> None:
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=20)
    engine = engine_factory()
    alone = engine.generate([prompts[2]], seeded)[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=20)
    batch = engine.generate([prompts[0], prompts[2], prompts[1]], [others, seeded, others])
    assert batch[1].token_ids == alone
    other_seed = engine.generate([prompts[2]], SamplingParams(temperature=1.0, seed=99, max_tokens=20))[0]
    assert other_seed.token_ids != alone


def test_requests_that_can_never_run_are_refused(engine_factory: Any) -> None:
    engine = engine_factory(max_model_len=64)
    with pytest.raises(InvalidRequestError, match="context"):
        engine.add_request("long", list(range(100, 200)), GREEDY)
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.add_request("empty", [], GREEDY)
    with pytest.raises(InvalidRequestError, match="token ids"):
        engine.add_request("vocab", [10**7], GREEDY)
    assert not engine.has_unfinished()
