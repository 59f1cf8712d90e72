"""Short forms of the benchmarks in bench/, run as `make test` runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, out: Path, *args: str) -> dict[str, Any]:
    """Run bench/<script> in its short form (with `args`) and return the figures it wrote to `out`."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    print(result.stdout)
    return json.loads(out.read_text())  # type: ignore[no-any-return]
