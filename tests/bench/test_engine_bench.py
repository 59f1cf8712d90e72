"""The short form of bench/engine.py: Mohawk's engine (fp32 weights) against transformers, and
llama.cpp when llama-cpp-python is installed, in one run, as ratios. Native 4-bit weights, which get
no floor here, are measured by `make bench` (their memory is checked by
tests/shard/engine/test_native_weights.py), which keeps this test to two runners on CI's two cores."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.bench import run_bench


@pytest.mark.timeout(900)  # run_bench's own limit
def test_engine_beats_transformers_in_the_same_run(tmp_path: Path) -> None:
    figures = run_bench("engine.py", tmp_path / "engine.json", "--weights", "fp32")
    # the aggregate target (1.5x transformers' batched generate), and batch 1 not slower, for fp32
    # weights (transformers' own). The full form measures batch-1 decode at 1.28x
    # (docs/benchmarks.md, medians). The short form's runs share a 2-core CI machine with whatever
    # else runs there: one CI run measured Mohawk's batch-1 medians between 2.7 and 21.2 tokens/s,
    # so the floors compare each side's best run (timeit's advice), which a busy neighbour cannot
    # drag down, and keep 10% for noise on batch-1 decode.
    best = figures["best_ratios"]["mohawk-fp32"]["transformers"]
    assert best["aggregate"] >= 1.5, figures
    assert best["decode"] >= 0.9, figures
    assert best["ttft_speedup"] >= 1.0, figures
    assert set(figures["ratios"]) == {"mohawk-fp32"}
    has_llama_cpp = importlib.util.find_spec("llama_cpp") is not None
    assert ("llama.cpp" in figures["stats"]) == has_llama_cpp, figures["llama_cpp"]
    if has_llama_cpp:
        assert figures["stats"]["llama.cpp"]["decode"]["median"] > 0
        assert "llama.cpp" in figures["ratios"]["mohawk-fp32"]
