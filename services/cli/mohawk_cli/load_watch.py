"""What `mohawk up` says while its nodes load: each node's latest weight-load progress, from its log.

A node logs `LOADING_EVENT` as its stage's layers are held (`mohawk_shard.model.load_progress`;
the one-layer stage it builds to measure itself says nothing), and only events after the node's
latest "node measured" line count: a restarted node's earlier load is not shown as its own.
`LoadWatch.poll` says a line for each node whose progress moved since it last looked
("shard-1 loading layers [0, 16): 45% (3.1 s)").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from mohawk_shard.model.load_progress import LOADING_EVENT, MEASURED_EVENT

_TAIL_BYTES = 1 << 18  # the part of a log read each time: the latest load is near its end


def node_progress(log: Path) -> str | None:
    """`layers [0, 16): 45% (3.1 s)` for the latest load in a node's log since it measured itself;
    None before any (or where the log cannot be read)."""
    try:
        with log.open("rb") as file:
            file.seek(max(0, file.seek(0, 2) - _TAIL_BYTES))
            lines = file.read().splitlines()
    except OSError:
        return None
    latest, measured = None, False
    for line in lines:
        if LOADING_EVENT.encode() not in line and MEASURED_EVENT.encode() not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if record.get("event") == MEASURED_EVENT:
            latest, measured = None, True
        elif record.get("event") == LOADING_EVENT and measured:
            latest = f"layers {record.get('layers')}: {record.get('percent')}% ({record.get('seconds')} s)"
    return latest


class LoadWatch:
    def __init__(self, log_dir: Path, say: Callable[[str], None]) -> None:
        self.log_dir, self.say = log_dir, say
        self._shown: dict[str, str] = {}

    def poll(self) -> None:
        """Say each node's progress that moved since the last poll."""
        for log in sorted(self.log_dir.glob("shard-*.log")):
            progress = node_progress(log)
            if progress is not None and progress != self._shown.get(log.stem):
                self._shown[log.stem] = progress
                self.say(f"{log.stem} loading {progress}")
