"""Environment variables a process reads outside its settings classes, registered where they are
read, so the configuration page lists every one (`docs_hooks/settings_tables.py`).

These are the knobs a module needs before any settings object exists (a kernel library loaded at
import, a cache a command-line tool shares with the services); each module names its own with
`env_knob(name, default, what)`, which returns the name to read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EnvKnob:
    name: str
    default: str
    what: str


KNOBS: dict[str, EnvKnob] = {}


def env_knob(name: str, default: str, what: str) -> str:
    """Register environment variable `name` (its default and meaning, for the docs); returns `name`."""
    KNOBS[name] = EnvKnob(name, default, what)
    return name
