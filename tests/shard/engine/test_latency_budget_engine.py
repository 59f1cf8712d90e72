"""The in-process engine on a tiny random-weight model under latency budgets (fair share itself is
tested on the queue, test_fair_queue.py, and through the scheduler, test_scheduler_fair_share.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.engine.sampling_params import SamplingParams

from .test_architectures import build_tiny

PARAMS = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
PROMPTS = {"tight": [1, 2, 3, 4, 5], "loose": [300, 301, 302]}


@pytest.fixture(scope="module")
def tiny_source(bundled: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> ModelSource:
    directory: Path = tmp_path_factory.mktemp("fair-share")
    build_tiny("llama-gqa4-tied", directory, bundled.load_tokenizer())
    return open_model(directory)


def test_events_carry_batch_size_and_budget_missed(tiny_source: ModelSource, engine_factory: Any) -> None:
    settings = {"source": tiny_source, "block_size": 4, "num_kv_blocks": 64}
    alone = engine_factory(**settings).generate(list(PROMPTS.values()), PARAMS)
    engine = engine_factory(**settings)
    engine.add_request("tight", PROMPTS["tight"], PARAMS, tenant="a", latency_budget_ms=1e-6)
    engine.add_request("loose", PROMPTS["loose"], PARAMS, tenant="b", latency_budget_ms=1e9)
    events = list(engine.run())
    # the first step ran both prompts; from then on no step fits the tight budget, so each runs one
    assert [e.batch_size for e in events] == [2, 2, 1, 1, 1, 1]
    assert all(e.budget_missed == (e.request_id == "tight") for e in events)
    assert engine.emitter.num_budget_missed == 3
    assert engine.core.step_times.num_samples == 5
    by_request = {r: [e.token_id for e in events if e.request_id == r] for r in PROMPTS}
    assert [by_request[r] for r in PROMPTS] == [c.token_ids for c in alone]  # capping changes no token


def test_without_budgets_steps_take_everyone(tiny_source: ModelSource, engine_factory: Any) -> None:
    engine = engine_factory(source=tiny_source, block_size=4, num_kv_blocks=64)
    for request_id, prompt in PROMPTS.items():
        engine.add_request(request_id, prompt, PARAMS, tenant=request_id, weight=2.0)
    events = list(engine.run())
    assert [e.batch_size for e in events] == [2] * 6 and not any(e.budget_missed for e in events)
