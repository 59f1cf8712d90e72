"""A benchmark's result file: its figures, the table it printed, and the stamp that says where they came from.

Every benchmark in bench/ writes its `--json` file through `write_results`, which adds a `stamp`
(the git commit and whether the tree had uncommitted changes, the machine, the exact command line
and the UTC date) and the markdown table the benchmark printed, beside the figures it already
wrote. The figures keep their own keys at the top level, so a reader of the old files (the tests
under tests/bench/) reads them as before. The docs site renders these files as tables headed by
their stamp (`docs_hooks/bench_results.py`); `make bench` writes them to bench/results/, which is
committed, so a figure in the docs is always one that a saved run printed. A run from a tree with
uncommitted changes is refused there (its stamp could name no commit that holds the code that
ran); elsewhere (`--json /tmp/...`) it is written, stamped dirty.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"  # the saved runs the docs render


class DirtyTreeError(SystemExit):
    """A result for bench/results/ from a tree with uncommitted changes."""


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> dict[str, Any]:
    """The checkout's short commit hash, and whether tracked files differ from it (`dirty`). A copy
    of a commit's files under an older git history (a lent GPU machine's) is named by
    `MOHAWK_RESULTS_COMMIT`, which its runner sets only after the files' git tree hash matched that
    commit's (`bench/gpu_check.sh` does so)."""
    copied = os.environ.get("MOHAWK_RESULTS_COMMIT")
    if copied:
        return {"hash": copied, "dirty": False, "matched": "tree hash"}
    short = _git("rev-parse", "--short", "HEAD")
    changes = _git("status", "--porcelain", "--untracked-files=no")
    return {"hash": short or "unknown", "dirty": bool(changes) if changes is not None else None}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The CPU model and core count, the OS, Python and torch, and the GPU when CUDA has one."""
    found: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": None,
        "gpu": None,
    }
    try:
        import torch
    except ImportError:
        return found
    found["torch"] = torch.__version__
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
    return found


def command(argv: Sequence[str] | None = None) -> str:
    """The command line that ran this benchmark, as one would type it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    name = script.relative_to(ROOT).as_posix() if script.is_relative_to(ROOT) else sys.argv[0]
    return shlex.join(["python", name, *(sys.argv[1:] if argv is None else argv)])


def stamp(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Where a result comes from: commit, machine, command and UTC date (`argv`: main's own, if given)."""
    return {
        "commit": commit(),
        "machine": machine(),
        "command": command(argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def write_results(
    path: Path,
    figures: Mapping[str, Any],
    table: str | Sequence[str] = (),
    argv: Sequence[str] | None = None,
) -> None:
    """Write `figures` to `path` as JSON with their `stamp` and the printed `table` (markdown lines)."""
    lines = table.splitlines() if isinstance(table, str) else list(table)
    document = {"stamp": stamp(argv), "table": lines, **figures}
    saved = Path(path).resolve().is_relative_to(RESULTS_DIR.resolve())
    if saved and document["stamp"]["commit"].get("dirty") is not False:
        raise DirtyTreeError(
            f"bench: not saving {path}: the tree has uncommitted changes (or git cannot say), so no "
            "commit would hold the code that ran; commit first, or write it outside bench/results/"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
