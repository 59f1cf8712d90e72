"""`mohawk up` says each node's load progress from its log, and only once the node has measured itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mohawk_cli.load_watch import LoadWatch, node_progress


def _line(event: str, **fields: Any) -> str:
    return json.dumps({"event": event, "logger": "mohawk.shard", "level": "info", **fields}) + "\n"


def _loading(layers: str, percent: int, seconds: float) -> str:
    return _line("loading weights", layers=layers, loaded=1, of=1, percent=percent, seconds=seconds)


def test_the_latest_load_after_the_node_measured_itself(tmp_path: Path) -> None:
    log = tmp_path / "shard-1.log"
    assert node_progress(log) is None  # no log yet
    log.write_text(_line("certificate loaded") + _loading("[1, 2)", 100, 0.1))  # before it measured
    assert node_progress(log) is None
    with log.open("a") as file:
        file.write(_line("node measured") + "not json {\n" + "[1, 2]\n" + _loading("[0, 30)", 40, 1.0))
    assert node_progress(log) == "layers [0, 30): 40% (1.0 s)"
    with log.open("a") as file:
        file.write(_loading("[0, 30)", 100, 2.5) + _line("stage loaded"))
    assert node_progress(log) == "layers [0, 30): 100% (2.5 s)"
    with log.open("a") as file:  # restarted: measured again, nothing loading yet
        file.write(_line("certificate loaded") + _line("node measured"))
    assert node_progress(log) is None


def test_a_line_only_when_a_node_moved(tmp_path: Path) -> None:
    said: list[str] = []
    watch = LoadWatch(tmp_path, said.append)
    one, two = tmp_path / "shard-1.log", tmp_path / "shard-2.log"
    one.write_text(_line("node measured") + _loading("[0, 15)", 20, 0.5))
    two.write_text(_line("node up"))
    (tmp_path / "gateway.log").write_text(_line("node measured") + _loading("[0, 1)", 100, 0.1))
    watch.poll()
    watch.poll()
    two.write_text(_line("node measured") + _loading("[15, 30)", 100, 1.5))
    watch.poll()
    assert said == [
        "shard-1 loading layers [0, 15): 20% (0.5 s)",
        "shard-2 loading layers [15, 30): 100% (1.5 s)",
    ]
