"""The newest slice package this node has loaded, per model, kept on its own disk across restarts.

Design. A slice package is signed by the operator root and its manifest names the model revision
and when it was packed (`created`). A node told which revision to expect (`model_revision`)
refuses any other (`slices.open_slice`). A node told nothing expects the newest it has accepted:
an older signed package put back into the object store (weights since replaced, rolled back by
anyone who may write the store) is refused as `replayed`, as an older signed plan is, whatever
revision it names. The mark is one JSON object, {model: {"created", "revision"}}, in a file of
the node's own (`state_dir`), which the bus cannot reach, replaced atomically; a file that does
not parse is reported and counted from nothing (the first package then sets the mark again).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from mohawk_pqc.errors import AuthenticationError

log = structlog.get_logger("mohawk.shard")

FILE_NAME = "slice-high-water.json"


class SliceHighWater:
    """The newest package accepted per model, under `state_dir`."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / FILE_NAME

    def check(self, model: str, manifest: Mapping[str, Any]) -> None:
        """AuthenticationError (`replayed`) when `manifest` was packed before the newest package of
        `model` this node has accepted."""
        mark = self._read().get(model)
        created = _created(manifest)
        if mark is not None and created < float(mark["created"]):
            raise AuthenticationError(
                "replayed",
                f"slice package of revision {manifest.get('model_revision')!r} packed at {created:.0f}, "
                f"before revision {mark.get('revision')!r} (packed at {float(mark['created']):.0f}) "
                "this node loaded",
            )

    def accept(self, model: str, manifest: Mapping[str, Any]) -> None:
        """Raise the mark of `model` to `manifest` (a package that passed `check` and verified)."""
        marks = self._read()
        created = _created(manifest)
        if model in marks and float(marks[model]["created"]) >= created:
            return
        marks[model] = {"created": created, "revision": str(manifest.get("model_revision", ""))}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        with open(temporary, "w") as out:
            json.dump(marks, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            marks = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning(
                "slice high-water unreadable: counted from nothing", path=str(self.path), error=str(exc)
            )
            return {}
        if not isinstance(marks, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("created"), int | float) for v in marks.values()
        ):
            log.warning("slice high-water malformed: counted from nothing", path=str(self.path))
            return {}
        return marks


def _created(manifest: Mapping[str, Any]) -> float:
    created = manifest.get("created")
    if not isinstance(created, int | float) or isinstance(created, bool):
        raise AuthenticationError("malformed", f"slice manifest without a packing time: {created!r}")
    return float(created)
