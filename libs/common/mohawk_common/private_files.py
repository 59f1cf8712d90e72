"""Writing a file that holds a secret (a key, a seed, a password) or sits beside one: always a new
file, whatever was at the path (a leftover file keeps its old mode, a planted link would be
followed), created with its mode so the umask never widens it, and never through a link."""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE = 0o600
PUBLIC = 0o644


def write_new(path: Path, data: bytes | str, mode: int = PRIVATE) -> None:
    """`data` as a new file at `path` with exactly `mode` (parents made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), mode)
        out.write(data.encode() if isinstance(data, str) else data)
