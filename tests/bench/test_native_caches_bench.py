"""The short form of bench/native_caches.py: with the shard's kernel-cache bounds and padded dense
rows, a stage's memory stops growing with the number of row counts it meets. `make bench` runs it
(MOHAWK_FULL=1) before the full form; `make test` leaves it out (19 s on CI's 2 cores)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from mohawk_shard.model.quantized_layers import native_bf16_matmul
from tests.bench import run_bench


@pytest.mark.full_form
@pytest.mark.skipif(not native_bf16_matmul(), reason="this CPU has no native bf16 matmul (AVX512-BF16/AMX)")
def test_bounded_caches_and_padded_rows_stop_the_growth(tmp_path: Path) -> None:
    figures = run_bench("native_caches.py", tmp_path / "caches.json", "--steps", "150", "--rounds", "1")
    grown = {name: statistics.median(r["rss_mib"] for r in runs) for name, runs in figures["runs"].items()}
    defaults, padded = grown["torch defaults, exact rows"], grown["caches bounded, padded rows"]
    bounded = grown["caches bounded, exact rows"]
    # by default each new row count of the 150 steps compiles and keeps a kernel for each of the 4
    # linears (200 steps grew 489 MiB here); padded rows meet 14 counts, whose kernels fit the bounds
    assert defaults > 100, grown
    assert padded < defaults / 3, grown
    # the bounds alone hold the kernels to 64 a cache (torch still reads both variables)
    assert bounded < defaults / 2, grown
