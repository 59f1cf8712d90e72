"""The short form of bench/distributed.py: the single-process engine against a 3-stage `mohawk up` cluster.

`make bench` runs it (MOHAWK_FULL=1) before the full form. `make test` leaves it out: that a
3-stage cluster serves as it should is tests/integration/test_cluster.py's check there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import run_bench

pytestmark = pytest.mark.full_form


def test_three_stage_cluster_against_the_single_process_engine(tmp_path: Path) -> None:
    figures = run_bench("distributed.py", tmp_path / "distributed.json")
    results = figures["results"]
    single = results["single process"]
    cluster = results["mohawk up --nodes 3"]
    assert cluster["stages"] == 3 and cluster["decode_tps"]["median"] > 0
    # The targets are 1.5x transformers' static batch of 32 (and, earlier, 0.85x the single
    # process) and <= 1 ms per hop; the full form measures them (docs/benchmarks.md: 2.16x, 0.93x and 0.58 ms
    # on 2 cores, where 3 stages share two cores with the gateway and NATS). The short form's
    # single runs swing widely on a shared 2-core CI machine, so here the floor only catches a
    # pipeline that stalls or serialises badly.
    ratio = cluster["concurrent_tps"]["median"] / single["concurrent_tps"]["median"]
    assert ratio >= 0.3, ratio
    idle_hop_median_ms = cluster["hops_idle_ms"][0]
    assert 0 < idle_hop_median_ms <= 5.0, cluster["hops_idle_ms"]
