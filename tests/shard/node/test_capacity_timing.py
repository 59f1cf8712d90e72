"""A node's measured layer speed is the fastest of back-to-back runs spread over `SPREAD_S`: a burst of
other work on the host (another node loading, a gateway starting) that slows the first runs does
not make the node look slower than it is."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mohawk_shard.node import capacity


class BurstyLayer:
    """Stands in for a backend's one-layer forward: 20 ms a run while the burst lasts, 1 ms after."""

    name, device, has_embedding = "stand-in", "cpu", False

    def __init__(self, burst_s: float) -> None:
        self.until = time.monotonic() + burst_s
        self.runs = 0

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        pass

    def decode_hidden(self, dtype: str, shape: list[int], data: bytes) -> Any:
        return data

    def forward(self, batch: Any, hidden: Any) -> None:
        self.runs += 1
        time.sleep(0.02 if time.monotonic() < self.until else 0.001)


def test_the_fastest_run_after_a_burst_is_what_the_node_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capacity, "SPREAD_S", 0.6)
    layer = BurstyLayer(burst_s=0.35)  # a dozen runs back to back would all fall inside it
    seconds = capacity._time_one_layer(layer, 16, 8)  # type: ignore[arg-type]
    assert seconds < 0.01
    assert layer.runs > 12


def test_a_fast_layer_stops_at_the_most_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capacity, "SPREAD_S", 60.0)
    monkeypatch.setattr(capacity, "_MAX_RUNS", 50)
    layer = BurstyLayer(burst_s=0.0)
    started = time.monotonic()
    capacity._time_one_layer(layer, 16, 8)  # type: ignore[arg-type]
    assert layer.runs == 51 and time.monotonic() - started < 5
