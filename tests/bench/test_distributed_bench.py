"""The short form of bench/distributed.py: the single-process engine against a 3-stage `mohawk up` cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_three_stage_cluster_against_the_single_process_engine(tmp_path: Path) -> None:
    out = tmp_path / "distributed.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "distributed.py"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    print(result.stdout)
    results = json.loads(out.read_text())["results"]
    single = results["single process"]
    cluster = results["mohawk up --nodes 3"]
    assert cluster["stages"] == 3 and cluster["decode_tps"]["median"] > 0
    # The targets are 0.85x the single process at 32 streams and <= 1 ms per hop; the full
    # form measures them (README). On a shared 2-core CI machine the short form's single runs
    # swing by more than that margin, so here they are checked with room for that noise.
    ratio = cluster["concurrent_tps"]["median"] / single["concurrent_tps"]["median"]
    assert ratio >= 0.5, ratio
    idle_hop_median_ms = cluster["hops_idle_ms"][0]
    assert 0 < idle_hop_median_ms <= 5.0, cluster["hops_idle_ms"]
