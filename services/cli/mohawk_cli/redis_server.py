"""The redis-server `mohawk up` starts: tenants, API keys, rate limits and sessions of the cluster.

Redis is not a Python wheel, so this runs the `redis-server` on PATH (Debian's, Homebrew's). With
`persist` its data lives under `data_dir` as an append-only file, so tenants and their keys
survive a restart; without it nothing is written (the tests' servers). It listens on 127.0.0.1
only, with Redis's protected mode on. With `password` it refuses every client that does not `AUTH`
with it: the password goes into a 0600 config file under `data_dir` (never onto the command line,
where `ps` shows it), and `url` carries it for the gateways (MOHAWK_REDIS_URL); `password_file`
(`ensure_password`) keeps one per data dir, which `mohawk tenant` reads too. With `tls` (a
certificate from the bus CA, `nats_tls.issue_server_certificate`) it speaks TLS only, on the same
port: `url` is then rediss://, and clients verify it against the bus CA (what a second host's
gateway does, `mohawk pki compose-bundles`).
"""

from __future__ import annotations

import secrets
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

from mohawk_common.bus.nats_tls import ServerTls, client_context
from mohawk_common.bus.server import free_port
from mohawk_common.errors import MohawkError
from mohawk_common.private_files import write_new
from mohawk_common.processes import kill_process, stop_process

REDIS_PORT = 6379  # Redis's usual port; `mohawk up` takes it when free
PASSWORD_FILE = "password"  # under the server's data dir: `mohawk up`'s Redis password


def ensure_password(path: Path) -> str:
    """The password in `path`, made (random, 0600) on first use."""
    if path.is_file() and not path.is_symlink():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    password = secrets.token_urlsafe(32)
    write_new(path, password + "\n")
    return password


INSTALL_HINT = "install it with `apt install redis-server` (Debian, Ubuntu) or `brew install redis` (macOS)"


class RedisServerError(MohawkError):
    """redis-server is missing, or did not start."""


def find_redis_server() -> str | None:
    """The redis-server binary on PATH, or None."""
    return shutil.which("redis-server")


class RedisServer:
    """One redis-server process on 127.0.0.1:`port`, its files under `data_dir`."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        persist: bool = True,
        log_file: Path | None = None,
        binary: str | None = None,
        password: str | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.password = password
        self.tls = tls
        self.port = port or free_port()
        self.persist = persist
        self.log_file = log_file
        self.binary = binary
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Where clients reach it, with its password (for the gateways' environment)."""
        auth = f":{self.password}@" if self.password else ""
        return f"{self._scheme}://{auth}127.0.0.1:{self.port}/0"

    @property
    def public_url(self) -> str:
        """Its URL without the password (what to print)."""
        return f"{self._scheme}://127.0.0.1:{self.port}/0"

    @property
    def _scheme(self) -> str:
        return "rediss" if self.tls is not None else "redis"

    def command(self) -> list[str]:
        binary = self.binary or find_redis_server()
        if binary is None:
            raise RedisServerError(f"redis-server not found; {INSTALL_HINT}")
        args = [binary]
        if self.password:  # the config file first: the flags after it add to it
            args.append(str(self._auth_conf()))
        args += ["--bind", "127.0.0.1", "--dir", str(self.data_dir)]
        if self.tls is None:
            args += ["--port", str(self.port)]
        else:  # TLS only: no plaintext port at all
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            args += ["--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)]
            args += ["--tls-ca-cert-file", str(self.tls.ca)]
        if self.persist:
            return [*args, "--appendonly", "yes"]
        return [*args, "--save", "", "--appendonly", "no"]

    def _auth_conf(self) -> Path:
        path = self.data_dir / "auth.conf"
        write_new(path, f'requirepass "{self.password}"\n')
        return path

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RedisServerError(f"redis-server exited at start (code {self.process.returncode})")
            if self.answers():
                return self
            time.sleep(0.05)
        self.stop()
        raise RedisServerError(f"redis-server did not answer on port {self.port} within {timeout:.0f} s")

    def answers(self) -> bool:
        """Whether the server answers PING (not while it is still loading its data)."""
        auth = f"AUTH {self.password}\r\n".encode() if self.password else b""
        try:
            with self._connection() as sock:
                sock.sendall(auth + b"PING\r\n")
                reply = b""
                while reply.count(b"\r\n") < (2 if auth else 1):
                    chunk = sock.recv(64)
                    if not chunk:
                        break
                    reply += chunk
                return reply.endswith(b"+PONG\r\n")
        except (OSError, ssl.SSLError):
            return False

    def _connection(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
        if self.tls is None:
            return sock
        return client_context(self.tls.ca).wrap_socket(sock, server_hostname="127.0.0.1")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (Redis then writes what it holds), SIGKILL after `timeout`."""
        stop_process(self.process, timeout)
        self.process = None

    def kill(self) -> None:
        kill_process(self.process)
        self.process = None
