"""The engine against Hugging Face transformers on the bundled SmolLM2-135M GGUF (fp32, CPU)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mohawk_common.chat import encode_chat
from mohawk_common.model_store import ModelSource
from mohawk_shard.engine.sampling_params import SamplingParams

from .conftest import full_logits, reference_greedy, reference_logits

LOGIT_TOLERANCE = 2e-3

CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada! How can I help you today?"},
        {"role": "user", "content": "What is my name, and what is 12 times 12?"},
    ],
    [
        {"role": "user", "content": "List three prime numbers."},
        {"role": "assistant", "content": "2, 3 and 5."},
        {"role": "user", "content": "Now write a Python function that checks whether a number is prime."},
    ],
]


@pytest.fixture(scope="module")
def prompts(bundled: ModelSource) -> list[list[int]]:
    tokenizer = bundled.load_tokenizer()
    return [encode_chat(tokenizer, chat) for chat in CHATS]


@pytest.mark.parametrize("split", [(), (10, 20)], ids=["whole", "3-way"])
def test_logits_match_reference(
    bundled: ModelSource, reference: Any, prompts: list[list[int]], split: tuple[int, ...]
) -> None:
    worst = 0.0
    for prompt in prompts[:3]:
        ours = full_logits(bundled, prompt, split)
        theirs = reference_logits(reference, prompt)
        worst = max(worst, (ours - theirs).abs().max().item())
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    print(f"\nmax |logit difference| vs transformers, split={split or 'none'}: {worst:.2e}")
    assert worst < LOGIT_TOLERANCE


def test_greedy_64_tokens_identical_to_transformers_generate(
    bundled: ModelSource, reference: Any, engine_factory: Any, prompts: list[list[int]]
) -> None:
    eos = list(bundled.config.eos_token_ids)
    expected = [reference_greedy(reference, p, 64, eos[0]) for p in prompts]
    engine = engine_factory(weights="fp32")  # transformers' fp32 arithmetic
    got = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=64))
    for want, completion in zip(expected, got, strict=True):
        assert completion.token_ids == want


def test_three_way_split_generates_same_text(engine_factory: Any, prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24)
    whole = engine_factory().generate(prompts[:2], params)
    split = engine_factory(split=(10, 20)).generate(prompts[:2], params)
    assert [c.text for c in split] == [c.text for c in whole]
    assert all(c.text for c in whole)
