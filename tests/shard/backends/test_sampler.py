"""Sampler: greedy, top-k/top-p, temperature, per-request seeds, penalties, min_tokens, logprobs."""

from __future__ import annotations

import math
import time

import pytest
import torch

from mohawk_shard.backends.sampler import Sampler, SamplingRow, step_seed
from mohawk_shard.engine.sampling_params import SamplingParams

EOS = 2


def row(output: tuple[int, ...] | range = (), **kwargs: object) -> SamplingRow:
    return SamplingRow(SamplingParams.create(**kwargs), output)


def sample_ids(sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
    return [t.token_id for t in sampler.sample(logits, rows)]


@pytest.fixture
def sampler() -> Sampler:
    return Sampler([EOS])


def random_logits(rows: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_greedy_is_argmax(sampler: Sampler, dtype: torch.dtype) -> None:
    logits = random_logits(8, 1000, seed=0).to(dtype)
    rows = [row(temperature=0.0) for _ in range(8)]
    assert sample_ids(sampler, logits, rows) == logits.float().argmax(dim=-1).tolist()


def test_fast_path_matches_slow_path(sampler: Sampler) -> None:
    logits = random_logits(32, 49152, seed=1)
    fast = sampler.sample(logits, [row(temperature=0.0) for _ in range(32)])
    # logprobs=0 and a min_tokens already met both force the general path; tokens must agree.
    slow = sampler.sample(logits, [row((5,), temperature=0.0, logprobs=0, min_tokens=1) for _ in range(32)])
    assert [t.token_id for t in fast] == [t.token_id for t in slow] == logits.argmax(-1).tolist()
    assert all(t.logprob is None for t in fast)
    assert all(t.logprob is not None for t in slow)


def test_input_logits_are_not_modified(sampler: Sampler) -> None:
    logits = random_logits(4, 100, seed=2)
    before = logits.clone()
    rows = [row((1, 1), presence_penalty=1.0, top_p=0.5, top_k=3, min_tokens=5, seed=i) for i in range(4)]
    sampler.sample(logits, rows)
    assert torch.equal(logits, before)


def test_top_k_1_equals_greedy(sampler: Sampler) -> None:
    logits = random_logits(16, 500, seed=3, scale=0.5)
    tokens = sample_ids(sampler, logits, [row(temperature=1.0, top_k=1) for _ in range(16)])
    assert tokens == logits.argmax(-1).tolist()
    # Also through the random path (top_k=1 with logprobs and unseeded noise).
    tokens = sample_ids(sampler, logits, [row(temperature=2.0, top_k=1, logprobs=1) for _ in range(16)])
    assert tokens == logits.argmax(-1).tolist()


def test_tiny_top_p_equals_greedy(sampler: Sampler) -> None:
    logits = random_logits(64, 500, seed=4, scale=0.5)
    tokens = sample_ids(sampler, logits, [row(temperature=1.0, top_p=1e-6) for _ in range(64)])
    assert tokens == logits.argmax(-1).tolist()


def test_top_k_never_leaves_the_k_best(sampler: Sampler) -> None:
    vocab, k, draws = 50, 5, 2000
    logits = random_logits(1, vocab, seed=5, scale=0.3).expand(draws, vocab)
    allowed = set(logits[0].topk(k).indices.tolist())
    rows = [row(temperature=2.0, top_k=k, seed=i if i % 2 else None) for i in range(draws)]
    tokens = sample_ids(sampler, logits, rows)
    assert set(tokens) == allowed  # never outside, and (with flat logits) every one of them is drawn


def test_top_p_keeps_the_smallest_nucleus(sampler: Sampler) -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(1000, 4)
    tokens = sample_ids(sampler, logits, [row(top_p=0.75, seed=i) for i in range(1000)])
    assert set(tokens) == {0, 1}  # 0.5 < 0.75 needs token 1; 0.8 >= 0.75 stops there


def test_top_p_nucleus_wider_than_the_candidates(sampler: Sampler) -> None:
    vocab, draws = 1000, 3000
    logits = -torch.arange(vocab, dtype=torch.float32) * 1e-3  # nearly flat, best first
    probs = torch.softmax(logits, dim=0)
    nucleus = int(((probs.cumsum(0) - probs) < 0.5).sum())
    assert nucleus > 256  # wider than the topk candidates: the full-sort path decides
    rows = [row(top_p=0.5, seed=i) for i in range(draws)]
    tokens = sample_ids(sampler, logits.expand(draws, vocab), rows)
    assert max(tokens) < nucleus
    assert max(tokens) > 256


def test_temperature_distribution_follows_softmax(sampler: Sampler) -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    temperature, draws = 0.8, 6000
    # One seed, one stream per step: draw i uses stream (seed, i).
    rows = [row(range(i), temperature=temperature, seed=1234) for i in range(draws)]
    tokens = torch.tensor(sample_ids(sampler, logits.expand(draws, 6), rows))
    observed = torch.bincount(tokens, minlength=6).double()
    expected = torch.softmax(logits.double() / temperature, dim=0) * draws
    chi_square = float(((observed - expected) ** 2 / expected).sum())
    assert chi_square < 25.0, (observed.tolist(), expected.tolist())  # df=5: p < 1e-4 beyond 25
    wrong_temperature = torch.softmax(logits.double(), dim=0) * draws
    assert float(((observed - wrong_temperature) ** 2 / wrong_temperature).sum()) > 100.0


SEEDED_CASES = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 1.3, "top_k": 20},
    {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "presence_penalty": 0.5, "frequency_penalty": 0.2},
    {"temperature": 1.0, "min_tokens": 3, "logprobs": 2},
]


def _other_rows(step: int) -> list[SamplingRow]:
    """Seven neighbours whose parameters and history change from step to step."""
    variety: list[dict[str, object]] = [
        {"temperature": 0.0},
        {"temperature": 1.0},
        {"temperature": 0.5, "top_p": 0.5, "seed": 99},
        {"temperature": 1.5, "top_k": 3, "logprobs": 5},
        {"temperature": 1.0, "presence_penalty": 1.0, "seed": 42},  # same seed as the row under test
        {"temperature": 0.8, "top_p": 0.3, "top_k": 100},
        {"temperature": 0.0, "frequency_penalty": -1.0, "min_tokens": 50},
    ]
    return [row(tuple(range(step + j)), **variety[(j + step) % 7]) for j in range(7)]


@pytest.mark.parametrize("case", SEEDED_CASES)
def test_seed_is_independent_of_batch(sampler: Sampler, case: dict[str, object]) -> None:
    vocab, steps = 1000, 12
    alone: list[int] = []
    batched: list[int] = []
    for step in range(steps):
        logits = random_logits(1, vocab, seed=100 + step, scale=1.0)
        alone.append(sample_ids(sampler, logits, [row(tuple(alone), seed=42, **case)])[0])
        others = _other_rows(step)
        batch_rows = [*others[:5], row(tuple(batched), seed=42, **case), *others[5:]]
        batch_logits = random_logits(8, vocab, seed=1000 + step, scale=1.0)
        batch_logits[5] = logits[0]
        batched.append(sample_ids(Sampler([EOS]), batch_logits, batch_rows)[5])
    assert alone == batched
    assert len(set(alone)) > 1


def test_preempted_row_replays_the_same_token(sampler: Sampler) -> None:
    logits = random_logits(1, 1000, seed=6, scale=0.5)
    history = (17, 3, 9)
    first = sample_ids(sampler, logits, [row(history, seed=7)])
    again = sample_ids(Sampler([EOS]), logits, [row(history, seed=7)])
    assert first == again


def test_different_seeds_differ(sampler: Sampler) -> None:
    logits = random_logits(1, 1000, seed=7, scale=0.2)
    tokens = {
        seed: [sample_ids(sampler, logits, [row(range(i), seed=seed)])[0] for i in range(10)]
        for seed in (1, 2)
    }
    assert tokens[1] != tokens[2]
    assert len(set(tokens[1])) > 1  # the stream moves with the step, too


def test_step_seed_is_63_bit_and_mixes() -> None:
    seeds = {step_seed(s, i) for s in (0, 1, -1, 2**40 + 3) for i in range(50)}
    assert len(seeds) == 200
    assert all(0 <= s < 2**63 for s in seeds)


def _greedy(sampler: Sampler, logits: list[float], output: tuple[int, ...], **kwargs: object) -> int:
    return sample_ids(sampler, torch.tensor([logits]), [row(output, temperature=0.0, **kwargs)])[0]


@pytest.mark.parametrize("margin", [-0.01, 0.01])
def test_presence_penalty_is_subtracted_once(sampler: Sampler, margin: float) -> None:
    penalty = 0.7
    # Token 0 was produced twice: its logit becomes 5 - 0.7 (not 5 - 1.4).
    logits = [5.0, 5.0 - penalty + margin, 0.0, 0.0]
    assert _greedy(sampler, logits, (0, 0, 3), presence_penalty=penalty) == (1 if margin > 0 else 0)


@pytest.mark.parametrize("margin", [-0.01, 0.01])
def test_frequency_penalty_scales_with_count(sampler: Sampler, margin: float) -> None:
    penalty = 0.4
    logits = [5.0, 5.0 - 3 * penalty + margin, 0.0, 0.0]
    assert _greedy(sampler, logits, (0, 0, 0, 3), frequency_penalty=penalty) == (1 if margin > 0 else 0)


def test_both_penalties_and_negative_penalty(sampler: Sampler) -> None:
    logits = [5.0, 5.0 - (2 * 0.3 + 0.5) + 0.01, 0.0]
    assert _greedy(sampler, logits, (0, 0), frequency_penalty=0.3, presence_penalty=0.5) == 1
    logits = [5.0, 5.0 - (2 * 0.3 + 0.5) - 0.01, 0.0]
    assert _greedy(sampler, logits, (0, 0), frequency_penalty=0.3, presence_penalty=0.5) == 0
    assert _greedy(sampler, [5.0, 4.0, 0.0], (1,), presence_penalty=-1.5) == 1
    assert _greedy(sampler, [5.0, 4.0, 0.0], (), presence_penalty=2.0) == 0  # nothing generated yet


def test_min_tokens_suppresses_eos_and_stop_token_ids(sampler: Sampler) -> None:
    logits = [0.0, 1.0, 9.0, 8.0, 0.5]  # eos (2) best, then stop token 3
    kwargs = {"min_tokens": 3, "stop_token_ids": [3]}
    assert _greedy(sampler, logits, (0, 0), **kwargs) == 1
    assert _greedy(sampler, logits, (0, 0, 0), **kwargs) == EOS
    assert _greedy(sampler, logits, (0, 0), min_tokens=3) == 3
    assert _greedy(sampler, logits, (0, 0), min_tokens=3, ignore_eos=True) == 3
    draws = sample_ids(
        sampler, torch.tensor([logits]).expand(200, 5), [row(min_tokens=1, seed=i) for i in range(200)]
    )
    assert EOS not in draws and 3 in draws


def test_logprobs_are_raw_log_softmax(sampler: Sampler) -> None:
    logits = random_logits(3, 300, seed=8)
    rows = [
        row((4, 4), temperature=0.7, top_p=0.9, presence_penalty=1.0, logprobs=5, seed=1),
        row(temperature=0.0),
        row(temperature=0.0, logprobs=0),
    ]
    out = sampler.sample(logits, rows)
    expected = torch.log_softmax(logits, dim=-1)
    for i in (0, 2):
        assert out[i].logprob == pytest.approx(float(expected[i, out[i].token_id]), abs=1e-5)
    assert out[1].logprob is None and out[1].top_logprobs == ()
    assert out[2].top_logprobs == ()
    top = out[0].top_logprobs
    assert [t for t, _ in top] == expected[0].topk(5).indices.tolist()
    assert [v for _, v in top] == pytest.approx(expected[0].topk(5).values.tolist(), abs=1e-5)
    assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)


def test_never_returns_out_of_range_tokens(sampler: Sampler) -> None:
    logits = torch.full((3, 10), -math.inf)
    logits[1] = math.nan
    logits[2, 7] = 1.0
    rows = [row(min_tokens=5, top_p=0.5), row(seed=3), row((7,), presence_penalty=2.0, top_k=2)]
    tokens = sample_ids(sampler, logits, rows)
    assert all(0 <= t < 10 for t in tokens)
    assert tokens[2] == 7
    # Suppressing the only finite logit leaves nothing to sample: fall back to the raw argmax.
    only_eos = torch.full((2, 10), -math.inf)
    only_eos[:, EOS] = 3.0
    assert sample_ids(sampler, only_eos, [row(min_tokens=1), row(min_tokens=1, temperature=0.0)]) == [
        EOS,
        EOS,
    ]


def test_rejects_mismatched_rows(sampler: Sampler) -> None:
    with pytest.raises(ValueError, match="rows"):
        sampler.sample(torch.zeros(2, 5), [row()])
    assert sampler.sample(torch.zeros(0, 5), []) == []


def test_greedy_fast_path_is_fast(sampler: Sampler) -> None:
    logits = random_logits(1, 49152, seed=9)
    rows = [row(temperature=0.0)]
    timings = []
    for _ in range(30):
        start = time.perf_counter()
        sampler.sample(logits, rows)
        timings.append(time.perf_counter() - start)
    assert min(timings) < 1e-3
