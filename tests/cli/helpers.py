"""Running the `mohawk` command as a user does: a subprocess with no standard input."""

from __future__ import annotations

import subprocess
import sys


def mohawk(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mohawk_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
