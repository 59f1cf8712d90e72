"""`mohawk up`: the whole local cluster comes up, answers, brings back children killed with -9, and
Ctrl-C stops every process it started."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from mohawk_common.bus.server import free_port


def test_mohawk_up_serves_restarts_crashed_children_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    port, nats_port = free_port(), free_port()
    mohawk = str(Path(sys.executable).parent / "mohawk")
    command = [mohawk, "up", "--nodes", "1", "--port", str(port), "--nats-port", str(nats_port)]
    proc = subprocess.Popen(
        [*command, "--data-dir", str(tmp_path / "data")], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "mohawk up was not ready in time"
            time.sleep(0.5)
        body = {
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
        }
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == 4  # nats-server, coordinator, shard node, gateway
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
        assert len(children) == 4
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()
    assert f"http://127.0.0.1:{port}/v1" in out.decode()
    assert "curl" in out.decode()
    assert "gateway restarted" in err.decode() and "shard-1 restarted" in err.decode()
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert (tmp_path / "data" / "nats").is_dir() and (tmp_path / "data" / "logs" / "gateway.log").is_file()
