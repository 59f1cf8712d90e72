"""The short form of bench/engine.py: Mohawk's engine against transformers in one run, as ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_engine_beats_transformers_in_the_same_run(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "engine.py"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    print(result.stdout)
    ratios = json.loads(out.read_text())["ratios"]
    # the issue's aggregate target (1.5x transformers' batched generate), and no slower at batch 1
    assert ratios["aggregate"] >= 1.5, ratios
    assert ratios["decode"] >= 1.0, ratios
    assert ratios["ttft_speedup"] >= 1.0, ratios
