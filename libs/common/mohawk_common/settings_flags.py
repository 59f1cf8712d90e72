"""Command-line flags made from a settings class, so a flag's type, choices and help are the
setting's own (one description, one default, both in the settings class).

`add_setting_flags(parser, Settings, names)` adds `--<name>` (underscores as dashes) for each
named field: its type from the annotation (`str`, `int`, `float`, `Path`, a `Literal`'s values
as choices, `X | None` as X), a bool as `--name/--no-name`, its help the field's description
and environment variable. Every flag defaults to None, so `setting_overrides(args, names)` gives
`load_settings` only what was typed (flags above environment above the YAML file above the
class's defaults).
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from mohawk_common.settings import ENV_PREFIX


def add_setting_flags(
    parser: argparse.ArgumentParser, settings: type[BaseModel], names: Sequence[str]
) -> None:
    for name in names:
        field = settings.model_fields[name]
        flag = "--" + name.replace("_", "-")
        described = (field.description or name.replace("_", " ")).replace("%", "%%")
        text = f"{described} (env {ENV_PREFIX}{name.upper()})"
        convert, choices = _argument_type(field.annotation)
        if convert is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(flag, type=convert, choices=choices, default=None, help=text)


def setting_overrides(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The named settings given on the command line (None: not typed)."""
    return {name: value for name in names if (value := getattr(args, name, None)) is not None}


def _argument_type(annotation: Any) -> tuple[Callable[[str], Any] | type[bool], list[Any] | None]:
    """argparse's `type` and `choices` for a field's annotation."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _argument_type(members[0])
        return str, None
    if origin is Literal:
        values = list(get_args(annotation))
        return type(values[0]), values
    if annotation is bool:
        return bool, None
    if annotation in (int, float, str):
        return annotation, None
    if annotation is Path:
        return Path, None
    return str, None
