"""`mohawk up`: the whole local cluster comes up, answers, brings back children killed with -9, and
Ctrl-C (to its whole process group, as a terminal sends it) stops every process it started with
no restart messages; its NATS takes TLS only (a certificate from the bus CA in
the data dir) and refuses anonymous clients, plaintext ones and ones that do not trust the bus CA,
and every service does its work over TLS with its own role's credential (the server logs no
permission violation)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from mohawk_cli.redis_server import find_redis_server
from mohawk_common.bus.connect import connect
from mohawk_common.bus.nats_auth import TOOL_USERS, NatsAuth
from mohawk_common.bus.server import free_port

# nats-server, redis-server (where installed), coordinator, shard node, gateway, telemetry
NUM_CHILDREN = 6 if find_redis_server() else 5


def test_mohawk_up_serves_restarts_crashed_children_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    port, nats_port, redis_port, telemetry_port = free_port(), free_port(), free_port(), free_port()
    mohawk = str(Path(sys.executable).parent / "mohawk")
    command = [mohawk, "up", "--nodes", "1", "--port", str(port), "--nats-port", str(nats_port)]
    command += ["--redis-port", str(redis_port), "--telemetry-port", str(telemetry_port)]
    banner = tmp_path / "stdout.txt"
    with banner.open("wb") as stdout:
        proc = subprocess.Popen(  # its own process group, as a terminal's foreground job
            [*command, "--data-dir", str(tmp_path / "data")],
            stdout=stdout,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    try:
        # ready when mohawk up says so (its banner), as a user sees it: the gateway's /ready can
        # answer 200 a moment before mohawk up's own check does, and until then a dying child is a
        # failed start, not one to restart
        deadline = time.monotonic() + 240
        while "Mohawk is ready" not in banner.read_text():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "mohawk up was not ready in time"
            time.sleep(0.5)
        body = {
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
        }
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
        assert_nats_needs_credentials(
            f"tls://127.0.0.1:{nats_port}",
            NatsAuth(tmp_path / "data" / "pki" / "nats-auth"),
            tmp_path / "data" / "pki" / "nats-tls" / "ca.pem",
        )
        telemetry = f"http://127.0.0.1:{telemetry_port}"
        assert f"{telemetry}/" in banner.read_text()  # the dashboard's address, printed
        assert httpx.get(f"{telemetry}/metrics", timeout=10).status_code == 200
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == NUM_CHILDREN
        # supervision: kill -9 the gateway and the shard node; both come back and serve again
        for child in children:
            if any(m in " ".join(child.cmdline()) for m in ("mohawk_gateway", "mohawk_shard")):
                child.kill()
        time.sleep(1.0)
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, "mohawk up stopped when children died"
            try:
                reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
                if reply.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the killed children did not come back"
            time.sleep(1.0)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == NUM_CHILDREN
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = banner.read_text()
    assert proc.returncode == 0, err.decode()
    assert f"http://127.0.0.1:{port}/v1" in out and "curl" in out
    assert "gateway restarted" in err.decode() and "shard-1 restarted" in err.decode()
    assert "shard-1 loading layers [0, 30): 100%" in err.decode()  # what it said while it waited
    after_ctrl_c = err.decode().split("mohawk up: stopping...")[0].rsplit(" restarted", 1)[-1]
    assert "restarting" not in after_ctrl_c and "exited" not in after_ctrl_c, err.decode()
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert (tmp_path / "data" / "nats").is_dir() and (tmp_path / "data" / "logs" / "gateway.log").is_file()
    assert "ops.creds" in out  # the banner's `mohawk bus` line carries the ops credential
    assert f"MOHAWK_NATS_TLS_CA={tmp_path / 'data' / 'pki' / 'nats-tls' / 'ca.pem'}" in out  # and the CA
    nats_log = (tmp_path / "data" / "logs" / "nats.log").read_text()
    assert "Violation" not in nats_log, [line for line in nats_log.splitlines() if "Violation" in line]


def assert_nats_needs_credentials(url: str, auth: NatsAuth, ca: Path) -> None:
    """TLS only: a plaintext client is told to use TLS and one that trusts only the system's CAs
    is refused; anonymous clients are refused over TLS; the ops credential with the bus CA
    connects; the credentials, the NATS keys and the CA's key are 0600."""
    nodes = auth.dir.parent / "nodes"
    processes = [nodes / name / "nats.creds" for name in ("shard-1", "gateway", "coordinator-1")]
    keys = list((auth.dir / "keys").iterdir())
    for path in (auth.conf, *(auth.creds(u) for u in TOOL_USERS), *processes, *keys, ca.with_name("ca.key")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    host, port = url.removeprefix("tls://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as plaintext:
        assert b'"tls_required":true' in plaintext.recv(4096)
    with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        asyncio.run(connect(url, name="stranger", attempts=1, creds=auth.creds("ops")))
    with pytest.raises(ConnectionError, match=r"(?i)authorization violation"):
        asyncio.run(connect(url, name="anonymous", attempts=1, tls_ca=ca))

    async def as_ops() -> None:
        nc = await connect(url, name="ops", attempts=1, creds=auth.creds("ops"), tls_ca=ca)
        await nc.close()

    asyncio.run(as_ops())
