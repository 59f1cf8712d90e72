"""The short form of bench/backends.py: a torch/MLX/torch cluster measured end to end, with its plan.

`make bench` runs it (MOHAWK_FULL=1) before the full form. `make test` leaves it out: that a mixed
torch/MLX cluster serves and plans by speed is tests/integration/test_mixed_cluster.py's check there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import run_bench

pytestmark = pytest.mark.full_form

pytest.importorskip("mlx_lm", reason="the mlx extra (mlx, mlx-cpu, mlx-lm) is not installed")


def test_mixed_pipeline_serves_and_reports_its_plan(tmp_path: Path) -> None:
    results = run_bench("backends.py", tmp_path / "backends.json")["results"]
    mixed = results["torch, mlx, torch"]
    assert mixed["decode_tps"]["median"] > 0 and mixed["concurrent_tps"]["median"] > 0
    backends = [stage[1].split()[0] for stage in mixed["plan"]]
    assert backends == ["torch", "mlx", "torch"]
    assert mixed["plan"][0][2] == 0 and mixed["plan"][-1][3] == 30
