"""A stage's load says how far it has got: a line a second while it loads, always the last layer."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.model import weight_loading
from mohawk_shard.model.load_progress import LoadProgress, quiet


def test_a_line_per_interval_and_always_the_last_layer() -> None:
    now = [0.0]
    events: list[dict[str, Any]] = []
    progress = LoadProgress(4, 10, interval_s=1.0, clock=lambda: now[0], emit=lambda **f: events.append(f))
    for step in (0.3, 0.3, 0.5, 0.1, 1.2, 0.1):  # six layers, at these gaps
        now[0] += step
        progress.layer_loaded()
    assert [(e["loaded"], e["percent"], e["seconds"]) for e in events] == [
        (3, 50, 1.1),
        (5, 83, 2.4),
        (6, 100, 2.5),
    ]
    assert {e["layers"] for e in events} == {"[4, 10)"} and {e["of"] for e in events} == {6}


def test_a_fast_load_says_it_once_when_done() -> None:
    events: list[dict[str, Any]] = []
    progress = LoadProgress(0, 3, clock=lambda: 0.0, emit=lambda **f: events.append(f))
    for _ in range(3):
        progress.layer_loaded()
    assert [(e["loaded"], e["percent"]) for e in events] == [(3, 100)]


@pytest.fixture(scope="module")
def bundled() -> ModelSource:
    return open_model()


def test_building_a_stage_reports_its_layers(bundled: ModelSource, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[dict[str, Any]] = []
    every_layer = functools.partial(LoadProgress, interval_s=0.0, emit=lambda **f: events.append(f))
    monkeypatch.setattr(weight_loading, "LoadProgress", every_layer)
    weight_loading.build_stage(
        bundled, 26, 30, device=torch.device("cpu"), dtype=torch.float32, weights="native"
    )
    assert [e["loaded"] for e in events] == [1, 2, 3, 4]
    assert events[-1]["layers"] == "[26, 30)" and events[-1]["percent"] == 100


def test_a_quiet_stage_says_nothing() -> None:
    events: list[dict[str, Any]] = []
    with quiet():
        progress = LoadProgress(0, 1, emit=lambda **f: events.append(f))
        progress.layer_loaded()
    assert events == [] and progress.loaded == 1
