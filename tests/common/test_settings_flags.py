"""Flags made from a settings class (`settings_flags`): each flag's type, choices and help are its
setting's, and only what was typed overrides the settings."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from mohawk_common.settings import MohawkSettings, load_settings
from mohawk_common.settings_flags import add_setting_flags, setting_overrides
from mohawk_shard.node.config import NodeSettings
from mohawk_shard.node.main import FLAGS, add_arguments


class Example(MohawkSettings):
    name: str | None = Field(None, description="a name")
    count: int = Field(3, description="how many, at 100%")
    mode: Literal["fast", "exact"] = Field("exact", description="which way")
    place: Path | None = Field(None, description="where")
    loud: bool = Field(False, description="say more")


NAMES = ("name", "count", "mode", "place", "loud")


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser()
    add_setting_flags(made, Example, NAMES)
    return made


def test_flags_take_their_settings_types_choices_and_help() -> None:
    args = parser().parse_args(["--count", "7", "--mode", "fast", "--place", "/tmp/x", "--loud"])
    assert setting_overrides(args, NAMES) == {
        "count": 7,
        "mode": "fast",
        "place": Path("/tmp/x"),
        "loud": True,
    }
    assert parser().parse_args(["--no-loud"]).loud is False
    with pytest.raises(SystemExit):
        parser().parse_args(["--mode", "sloppy"])  # not one of the Literal's values
    text = parser().format_help()
    assert "how many, at 100% (env MOHAWK_COUNT)" in text and "{fast,exact}" in text


def test_only_typed_flags_override_and_the_defaults_stay_the_settings_own() -> None:
    args = parser().parse_args([])
    assert setting_overrides(args, NAMES) == {}
    assert load_settings(Example, setting_overrides(args, NAMES)).count == 3


def test_the_shard_nodes_flags_are_its_settings() -> None:
    made = argparse.ArgumentParser()
    add_arguments(made)
    for name in FLAGS:
        description = NodeSettings.model_fields[name].description or ""
        assert f"env MOHAWK_{name.upper()}" in " ".join(made.format_help().split()), name
        assert " ".join(description.split()[:3]) in " ".join(made.format_help().split()), name
