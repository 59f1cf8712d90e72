"""`python -m mohawk_coordinator` as processes: kill -9 the leader, then stop the survivor with SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import NatsServer, free_port
from mohawk_common.bus.setup import BusLimits, ensure_buckets
from tests.coordinator.harness import TTL_S

POLL_S = TTL_S / 10


def start(url: str, coordinator_id: str, log: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "mohawk_coordinator", "--coordinator-id", coordinator_id]
    args += ["--nats-url", url, "--lease-ttl-s", str(TTL_S), "--log-level", "info", "--insecure"]
    env = {**os.environ, "MOHAWK_HEARTBEAT_INTERVAL_S": "0.2", "MOHAWK_NODE_TTL_S": "0.6"}
    env["PYTHONFAULTHANDLER"] = "1"  # a hung process dumps its threads on SIGABRT
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)


def exit_code(process: subprocess.Popen[bytes], log: Path, timeout: float = 10) -> int:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        process.wait()
        raise AssertionError(f"no exit {timeout} s after SIGTERM:\n{log.read_text()[-6000:]}") from None


def test_kill_9_fails_over_and_sigterm_releases_the_lease(nats_server: NatsServer, tmp_path: Path) -> None:
    a = start(nats_server.url, "proc-a", tmp_path / "a.log")
    b = start(nats_server.url, "proc-b", tmp_path / "b.log")
    processes = {"proc-a": a, "proc-b": b}

    async def holder(kv: KeyValue) -> str | None:
        try:
            entry = await kv.get(names.LEADER_KEY)
        except KeyNotFoundError:
            return None
        return (entry.value or b"").decode()

    async def scenario() -> tuple[float, float]:
        nc = await connect(nats_server.url, name="test")
        kv = (await ensure_buckets(nc.jetstream(), BusLimits(lease_ttl_s=TTL_S))).leader
        deadline = time.monotonic() + 30
        while (leader := await holder(kv)) is None:
            assert time.monotonic() < deadline, "no process took the lease"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # both are up: the other one is a standby by now
        survivor = "proc-b" if leader == "proc-a" else "proc-a"
        processes[leader].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        while await holder(kv) != survivor:
            assert time.monotonic() - killed < 3 * TTL_S, "no failover"
            await asyncio.sleep(0.01)
        failover = time.monotonic() - killed
        processes[survivor].send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        # generous: on a loaded 2-core machine the lease release and NATS drain can take seconds
        assert exit_code(processes[survivor], tmp_path / f"{survivor[-1]}.log", timeout=30) == 0
        shutdown = time.monotonic() - stopped
        assert await holder(kv) is None  # released, not left to expire
        await nc.close()
        return failover, shutdown

    try:
        failover, shutdown = asyncio.run(scenario())
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    print(f"kill -9 failover between processes: {failover:.3f} s (ttl {TTL_S} s)")
    print(f"SIGTERM to exit: {shutdown:.3f} s")
    assert failover <= TTL_S + POLL_S + 0.4  # bound: ttl + one poll, plus process scheduling


def test_sigterm_while_nats_is_unreachable_exits_cleanly(tmp_path: Path) -> None:
    process = start(f"nats://127.0.0.1:{free_port()}", "lonely", tmp_path / "c.log")
    time.sleep(1.5)  # retrying the connection by now
    process.send_signal(signal.SIGTERM)
    assert exit_code(process, tmp_path / "c.log", timeout=5) == 0
    assert "Traceback" not in (tmp_path / "c.log").read_text()


def test_the_coordinator_imports_neither_transformers_nor_torch() -> None:
    """It plans from the nodes' heartbeats, never from the model file."""
    code = (
        "import sys, mohawk_coordinator.main, mohawk_coordinator.explain; "
        "print(','.join(m for m in ('torch', 'transformers', 'mlx') if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    assert loaded == ""
