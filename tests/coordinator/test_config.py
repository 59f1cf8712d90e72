"""Coordinator settings and flags: defaults, layering, one-line errors."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from mohawk_common.errors import ConfigError
from mohawk_common.settings import load_settings
from mohawk_coordinator import main
from mohawk_coordinator.config import CoordinatorSettings


def test_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("")
    monkeypatch.setenv("MOHAWK_CONFIG", str(tmp_path / "empty.yaml"))
    settings = load_settings(CoordinatorSettings)
    assert (settings.placement, settings.block_size, settings.max_model_len) == ("spread", 16, None)
    assert (settings.node_ttl_s, settings.heartbeat_interval_s) == (3.0, 1.0)
    assert settings.model is None and settings.served_model == "smollm2-135m-instruct"
    assert settings.coordinator_id.endswith(f"-{os.getpid()}")


def test_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOHAWK_PLACEMENT", "pack")
    monkeypatch.setenv("MOHAWK_LEASE_TTL_S", "9")
    parser = argparse.ArgumentParser()
    main.add_arguments(parser)
    args = parser.parse_args(
        ["--lease-ttl-s", "1.5", "--served-model-name", "tiny", "--coordinator-id", "c7"]
    )
    overrides = {"lease_ttl_s": args.lease_ttl_s, "served_model_name": args.served_model_name}
    settings = load_settings(CoordinatorSettings, overrides | {"coordinator_id": args.coordinator_id})
    assert (settings.placement, settings.lease_ttl_s, settings.served_model) == ("pack", 1.5, "tiny")


def test_bad_values_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="node_ttl_s"):
        load_settings(CoordinatorSettings, {"heartbeat_interval_s": 1.0, "node_ttl_s": 0.5})
    with pytest.raises(ConfigError, match="placement"):
        load_settings(CoordinatorSettings, {"placement": "random"})


def test_run_exits_2_on_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    main.add_arguments(parser)
    assert main.run(parser.parse_args(["--lease-ttl-s", "-1"])) == 2
    assert "lease_ttl_s" in capsys.readouterr().err
