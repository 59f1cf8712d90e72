"""Settings precedence (defaults < YAML < env < overrides) and the one-line errors of `load_settings`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from pydantic import Field

from mohawk_common.errors import ConfigError
from mohawk_common.settings import MohawkSettings, load_settings


class DemoSettings(MohawkSettings):
    yaml_section: ClassVar[str] = "demo"

    block_size: int = Field(16, ge=1)
    device: str = "auto"
    kv_cache_memory_mb: int | None = None
    name: str = "default"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No MOHAWK_* variables from the outside, and a working directory without config/mohawk.yaml."""
    for key in [k for k in os.environ if k.upper().startswith("MOHAWK_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def write_config(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_any_source() -> None:
    settings = load_settings(DemoSettings)
    assert (settings.block_size, settings.device, settings.kv_cache_memory_mb) == (16, "auto", None)


def test_default_yaml_file_is_read_relative_to_cwd(tmp_path: Path) -> None:
    write_config(tmp_path / "config" / "mohawk.yaml", "demo:\n  block_size: 32\n  kv_cache_memory_mb: 256\n")
    settings = load_settings(DemoSettings)
    assert settings.block_size == 32
    assert settings.kv_cache_memory_mb == 256
    assert settings.device == "auto"


def test_yaml_reads_only_its_own_section(tmp_path: Path) -> None:
    write_config(tmp_path / "config" / "mohawk.yaml", "other:\n  block_size: 99\ndemo:\n  name: mine\n")
    settings = load_settings(DemoSettings)
    assert (settings.block_size, settings.name) == (16, "mine")


def test_env_beats_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path / "config" / "mohawk.yaml", "demo:\n  block_size: 32\n  device: cpu\n")
    monkeypatch.setenv("MOHAWK_BLOCK_SIZE", "64")
    settings = load_settings(DemoSettings)
    assert (settings.block_size, settings.device) == (64, "cpu")


def test_overrides_beat_env_and_none_means_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(
        tmp_path / "config" / "mohawk.yaml", "demo:\n  block_size: 32\n  device: cpu\n  name: yaml\n"
    )
    monkeypatch.setenv("MOHAWK_BLOCK_SIZE", "64")
    monkeypatch.setenv("MOHAWK_DEVICE", "cuda")
    settings = load_settings(DemoSettings, {"block_size": 128, "device": None})
    assert (settings.block_size, settings.device, settings.name) == (128, "cuda", "yaml")


def test_mohawk_config_names_another_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path / "config" / "mohawk.yaml", "demo:\n  block_size: 32\n")
    other = write_config(tmp_path / "elsewhere.yaml", "demo:\n  block_size: 8\n")
    monkeypatch.setenv("MOHAWK_CONFIG", str(other))
    assert load_settings(DemoSettings).block_size == 8


def test_yaml_null_and_env_null_mean_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path / "config" / "mohawk.yaml", "demo:\n  kv_cache_memory_mb: null\n")
    assert load_settings(DemoSettings).kv_cache_memory_mb is None
    monkeypatch.setenv("MOHAWK_KV_CACHE_MEMORY_MB", "null")
    assert load_settings(DemoSettings, {"block_size": 4}).kv_cache_memory_mb is None


def test_missing_named_config_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOHAWK_CONFIG", str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigError, match=r"MOHAWK_CONFIG names .*absent\.yaml"):
        load_settings(DemoSettings)


def test_invalid_env_value_is_one_line_naming_field_and_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOHAWK_BLOCK_SIZE", "0")
    with pytest.raises(ConfigError) as caught:
        load_settings(DemoSettings)
    message = str(caught.value)
    assert "\n" not in message
    assert "block_size" in message
    assert "environment MOHAWK_BLOCK_SIZE" in message
    assert "greater than or equal to 1" in message


def test_invalid_yaml_value_names_the_file_and_section(tmp_path: Path) -> None:
    write_config(tmp_path / "config" / "mohawk.yaml", "demo:\n  block_size: lots\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(DemoSettings)
    message = str(caught.value)
    assert "\n" not in message
    assert "block_size = 'lots'" in message
    assert "mohawk.yaml section 'demo'" in message


def test_invalid_override_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"block_size = -3 \(from the command line, --block-size\)"):
        load_settings(DemoSettings, {"block_size": -3})


def test_broken_yaml_is_a_config_error(tmp_path: Path) -> None:
    write_config(tmp_path / "config" / "mohawk.yaml", "demo: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot be read as YAML"):
        load_settings(DemoSettings)


def test_section_that_is_not_a_mapping_is_a_config_error(tmp_path: Path) -> None:
    write_config(tmp_path / "config" / "mohawk.yaml", "demo: 3\n")
    with pytest.raises(ConfigError, match=r"section 'demo' .* must be a mapping"):
        load_settings(DemoSettings)


def test_required_field_error_says_where_to_set_it() -> None:
    class NeedsKey(MohawkSettings):
        yaml_section: ClassVar[str] = "needs"
        api_key: str

    with pytest.raises(
        ConfigError, match="api_key is required: set --api-key, MOHAWK_API_KEY or key 'api_key'"
    ):
        load_settings(NeedsKey)


def test_repo_config_file_matches_engine_defaults() -> None:
    """config/mohawk.yaml's `shard:` keys all exist on the engine settings and hold valid values."""
    repo_config = Path(__file__).resolve().parents[2] / "config" / "mohawk.yaml"
    document = yaml.safe_load(repo_config.read_text(encoding="utf-8"))
    from mohawk_shard.config import EngineSettings

    assert set(document["shard"]) <= set(EngineSettings.model_fields)
    EngineSettings(**document["shard"])
