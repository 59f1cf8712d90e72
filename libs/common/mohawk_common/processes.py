"""Stopping the server processes Mohawk starts itself (nats-server, redis-server): SIGTERM and a
grace period, then SIGKILL; or SIGKILL at once, as a crash test does."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM (the server writes what it holds), then SIGKILL if it has not exited in `timeout`."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_process(process)


def kill_process(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL, and reap it."""
    if process is not None and process.poll() is None:
        process.kill()
        process.wait()
