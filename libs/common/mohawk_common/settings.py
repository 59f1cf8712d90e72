"""Settings of every Mohawk process: one pydantic-settings class per service, layered the same way.

Precedence, highest first: command-line flags (passed as init kwargs, usually through
`load_settings`), environment variables `MOHAWK_<FIELD>`, the service's section of a YAML file,
the class's defaults. The YAML file is the one named by `MOHAWK_CONFIG`, which must exist, else
`config/mohawk.yaml` relative to the working directory, which may be absent. Each subclass names
its section with `yaml_section` (e.g. `shard`) and reads nothing else of the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml
from pydantic import Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from mohawk_common.errors import ConfigError

ENV_PREFIX = "MOHAWK_"
CONFIG_ENV = "MOHAWK_CONFIG"
DEFAULT_CONFIG_PATH = Path("config") / "mohawk.yaml"


def config_path() -> Path | None:
    """The YAML file to read: `$MOHAWK_CONFIG` (which must exist), else `config/mohawk.yaml` if present."""
    named = os.environ.get(CONFIG_ENV)
    if named:
        path = Path(named)
        if not path.is_file():
            raise ConfigError(f"{CONFIG_ENV} names {named!r}, which is not a readable file")
        return path
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


def read_yaml_section(section: str) -> tuple[dict[str, Any], Path | None]:
    """The mapping under `section` of the config file, and the file; empty when either is absent."""
    path = config_path()
    if not section or path is None:
        return {}, path
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        reason = str(exc).replace("\n", " ")
        raise ConfigError(f"config file {path} cannot be read as YAML: {reason}") from exc
    if document is None:
        return {}, path
    if not isinstance(document, dict):
        raise ConfigError(
            f"config file {path} must hold a mapping of sections, got {type(document).__name__}"
        )
    values = document.get(section)
    if values is None:
        return {}, path
    if not isinstance(values, dict):
        raise ConfigError(f"section {section!r} of {path} must be a mapping, got {type(values).__name__}")
    return values, path


class YamlSectionSource(InitSettingsSource):
    """The settings class's own section of the YAML config file, as if its keys were init kwargs."""

    def __init__(self, settings_cls: type[MohawkSettings]) -> None:
        values, _ = read_yaml_section(settings_cls.yaml_section)
        super().__init__(settings_cls, values)


class MohawkSettings(BaseSettings):
    """Base of every service's settings.

    Precedence, highest first: CLI flags (passed as init kwargs) > environment `MOHAWK_*` > YAML
    file (the section named by `yaml_section` in config/mohawk.yaml, or the file named by
    `MOHAWK_CONFIG`) > defaults. A class with an empty `yaml_section` reads no YAML.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        env_parse_none_str="null",
        extra="ignore",
        validate_default=True,
    )
    yaml_section: ClassVar[str] = ""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, YamlSectionSource(cls)


class KVBlockSettings(MohawkSettings):
    """The KV block size, one field for every process that must agree on it: the coordinator plans
    blocks of this many tokens (its plans carry it, and nodes size their caches from the plan), a
    shard node measures its KV bytes per block with it for its heartbeat, and the in-process engine
    sizes its cache by it. The bus settings and the shard engine's settings both take it from here."""

    block_size: int = Field(
        16,
        ge=1,
        le=1024,
        description="tokens per KV block: the coordinator plans with it (the plan carries it to every "
        "stage) and nodes measure their KV bytes per block with it, so set it alike for both",
    )


class ModelFileSettings(MohawkSettings):
    """The model file, one field for every process that opens it (a shard node or the in-process
    engine, the gateway for its tokenizer and chat template, the coordinator for the model's name):
    `model` is always the path, as vLLM's `--model` is; the name the API serves it under is
    `served_model_name`, or the file's stem (`bus.config.served_model_name`)."""

    model: str | None = Field(None, description="GGUF file or safetensors directory; none = bundled SmolLM2")


S = TypeVar("S", bound=MohawkSettings)


def load_settings(cls: type[S], overrides: Mapping[str, Any] | None = None) -> S:
    """Build `cls` from its sources, `overrides` (CLI flags; `None` means "flag not given") on top.

    Any invalid value raises `ConfigError` with one line naming the field, the value's source and
    what is wrong with it.
    """
    flags = {key: value for key, value in (overrides or {}).items() if value is not None}
    try:
        return cls(**flags)
    except ValidationError as exc:
        problems = [_describe(cls, error, flags) for error in exc.errors()]
        raise ConfigError("invalid settings: " + "; ".join(problems)) from None
    except SettingsError as exc:
        raise ConfigError(f"invalid settings: {exc}".replace("\n", " ")) from exc


def _describe(cls: type[MohawkSettings], error: Any, flags: Mapping[str, Any]) -> str:
    loc = error.get("loc") or ("?",)
    field = str(loc[0])
    dotted = ".".join(str(part) for part in loc)
    if error.get("type") == "missing" and len(loc) == 1:
        env_name = f"{ENV_PREFIX}{field}".upper()
        section = f" or key {field!r} of section {cls.yaml_section!r}" if cls.yaml_section else ""
        return f"{field} is required: set --{field.replace('_', '-')}, {env_name}{section}"
    where = _source_of(cls, field, flags)
    message = str(error.get("msg", "invalid value")).replace("\n", " ")
    value = error.get("input")
    shown = "" if isinstance(value, dict) else f" = {value!r}"
    return f"{dotted}{shown} (from {where}): {message}"


def _source_of(cls: type[MohawkSettings], field: str, flags: Mapping[str, Any]) -> str:
    """Which source supplied `field`, in the words a user would look for it by."""
    if field in flags:
        return f"the command line, --{field.replace('_', '-')}"
    env_name = f"{ENV_PREFIX}{field}".upper()
    if any(key.upper() == env_name or key.upper().startswith(env_name + "__") for key in os.environ):
        return f"environment {env_name}"
    try:
        values, path = read_yaml_section(cls.yaml_section)
    except ConfigError:
        values, path = {}, None
    if field in values:
        return f"{path} section {cls.yaml_section!r}"
    return "the default"
