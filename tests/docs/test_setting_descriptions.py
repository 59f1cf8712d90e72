"""A setting's description that cites a measurement says what the saved run measured: every
`bench/results/*.json` a description names exists, comes from a committed tree, and where the
description puts a figure on it (the batch-invariant mode's cost), the saved figure agrees. And
every setting is declared once, so its default is written once."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

from mohawk_common.settings import MohawkSettings
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


def _settings_classes() -> set[type[MohawkSettings]]:
    found: set[type[MohawkSettings]] = set()
    todo: list[type[MohawkSettings]] = [MohawkSettings]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found and sub.__module__.startswith("mohawk_"):
                found.add(sub)
                todo.append(sub)
    return found


# the same name in two processes, meaning each process's own (its own default and description)
PER_PROCESS = {
    "state_dir": "what this process keeps across restarts, under its own id",
    "max_model_len": "the coordinator's cap on the plan's context; the engine's on its own",
}


def test_every_setting_is_declared_once() -> None:
    """A setting two processes share is declared in one class they both inherit (`block_size` in
    `KVBlockSettings`, `model` in `ModelFileSettings`), so its default is written once."""
    declared: dict[str, list[str]] = {}
    for cls in _settings_classes():
        for name in inspect.get_annotations(cls):
            if name in cls.model_fields:
                declared.setdefault(name, []).append(cls.__name__)
    twice = {name: sorted(owners) for name, owners in declared.items() if len(owners) > 1}
    assert set(twice) <= PER_PROCESS.keys(), f"declared in more than one settings class: {twice}"
    assert {"NodeSettings", "GatewaySettings", "CoordinatorSettings", "BusSettings"} <= {
        c.__name__ for c in _settings_classes()
    }
