"""Running the `mohawk` command as a user does (a subprocess with no standard input), or in this
process, where a test needs its output captured by pytest."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mohawk_cli.main import main


def mohawk(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mohawk_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def mohawk_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`mohawk ARGS` in this process: exit status, stdout, stderr."""
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
