"""mkdocs hook: benchmark tables generated from the stamped result files in bench/results/.

A benchmark run with `--json bench/results/NAME.json` (as `make bench` runs them) saves its figures,
the table it printed and a stamp: commit, machine, command line and UTC date
(`bench/results_file.py`). In a page, a line `<!-- results: NAME -->` is replaced by that file's table,
headed by its stamp, and a line `<!-- results: * -->` by every saved file in turn, each under its name.
A marker naming a file that is not there, or a file without a stamp, fails the build: a figure on
the site is always one a saved run printed, with the command that printed it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

RESULTS_DIR = Path("bench/results")
MARKER = re.compile(r"^<!-- results: (\*|[\w.-]+) -->$", re.MULTILINE)  # a line of its own


def render_stamp(stamp: dict[str, Any]) -> str:
    """One paragraph: the command, then the commit, machine and date it ran on."""
    commit = stamp["commit"]
    changes = " with uncommitted changes" if commit.get("dirty") else ""
    machine = stamp["machine"]
    parts = [str(machine["cpu"]), f"{machine['cores']} cores"]
    parts += [f"torch {machine['torch']}"] if machine.get("torch") else []
    parts += [str(machine["gpu"])] if machine.get("gpu") else []
    date = stamp["date"].replace("T", " ").removesuffix("+00:00")
    return (
        f"Printed by `{stamp['command']}` at commit `{commit['hash']}`{changes}, "
        f"on {', '.join(parts)}, {date} UTC."
    )


def _leaves(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [leaf for key, inner in value.items() for leaf in _leaves(inner, f"{prefix}{key} ")]
    if isinstance(value, list):
        return []
    return [(prefix.strip(), value)]


def _table(document: dict[str, Any]) -> list[str]:
    """The table the benchmark printed; without one, its single figures as `figure | value` rows."""
    printed: list[str] = document.get("table") or []
    if printed:
        lines: list[str] = []
        for line in printed:  # a table needs a blank line between it and the text above it
            if line.startswith("|") and lines and lines[-1] and not lines[-1].startswith("|"):
                lines.append("")
            lines.append(line)
        return lines
    figures = {k: v for k, v in document.items() if k not in ("stamp", "table")}
    rows = [f"| {name} | {value} |" for name, value in _leaves(figures)]
    return ["| figure | value |", "|---|---|", *rows]


def render_result(path: Path) -> str:
    """A saved result file as markdown: its stamp, then its table."""
    document = json.loads(path.read_text())
    if "stamp" not in document:
        raise PluginError(f"{path} has no stamp: write it with bench/results_file.py")
    return "\n".join([render_stamp(document["stamp"]), "", *_table(document)])


def render(markdown: str, results_dir: Path) -> str:
    """Replace every results marker in `markdown` with the files of `results_dir` it names."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name != "*":
            path = results_dir / f"{name.removesuffix('.json')}.json"
            if not path.is_file():
                raise PluginError(f"{match.group(0)}: {path} is not there (run the benchmark with --json)")
            return render_result(path)
        paths = sorted(results_dir.glob("*.json"))
        if not paths:
            return f"No run has been saved in `{RESULTS_DIR}/` yet."
        return "\n\n".join(f"### {path.stem}\n\n{render_result(path)}" for path in paths)

    return MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown, Path(config.config_file_path).parent / RESULTS_DIR)
