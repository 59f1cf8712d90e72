"""A setting's description that cites a measurement says what the saved run measured: every
`bench/results/*.json` a description names exists, comes from a committed tree, and where the
description puts a figure on it (the batch-invariant mode's cost), the saved figure agrees."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from mohawk_coordinator.config import CoordinatorSettings
from mohawk_gateway.config import GatewaySettings
from mohawk_shard.node.config import NodeSettings

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(r"bench/results/[\w.-]+\.json")
SETTINGS: list[type[Any]] = [NodeSettings, CoordinatorSettings, GatewaySettings]


def _citations() -> list[tuple[str, str]]:
    found = {
        (f"{cls.__name__}.{name}", path)
        for cls in SETTINGS
        for name, field in cls.model_fields.items()
        for path in CITED.findall(field.description or "")
    }
    return sorted(found)


def test_some_description_cites_a_saved_run() -> None:
    assert _citations(), "no setting cites a saved run: the checks below check nothing"


@pytest.mark.parametrize(("setting", "path"), _citations())
def test_a_cited_run_is_saved_from_a_committed_tree(setting: str, path: str) -> None:
    saved = ROOT / path
    assert saved.is_file(), f"{setting} cites {path}, which is not saved"
    stamp = json.loads(saved.read_text())["stamp"]
    assert stamp["commit"]["dirty"] is False, f"{path} (cited by {setting}) ran on uncommitted code"


def test_the_batch_invariant_cost_is_the_one_measured() -> None:
    """The description says the non-invariant mode ran at half the throughput on a CPU."""
    description = NodeSettings.model_fields["batch_invariant"].description or ""
    assert "half the throughput" in description
    cost = json.loads((ROOT / "bench/results/batch-invariance-cpu.json").read_text())["cost"]
    ratio = cost["32 streams, invariant / not"]
    assert 1.6 <= ratio <= 2.5, f"the saved run measured {ratio}x, not about twice: reword the setting"
