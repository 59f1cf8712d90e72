"""A Mohawk cluster spread over the lab's hosts: one nats-server per host (a 3-server JetStream
cluster, routes between hosts, Mohawk's streams and buckets at 3 replicas), a NATS user per process
from `nats_auth` (each service gets its own, issued beside its certificate by
`mohawk_cli.bus_identity`, as MOHAWK_NATS_CREDS; every server a full resolver of the account, so a
revocation pushed to one reaches all), TLS on client
and route links from the bus CA of `nats_tls` (MOHAWK_NATS_TLS_CA, tls:// URLs), development
certificates from `pki_files`, and the services placed on the hosts the layout names.

Every child runs as `ip netns exec <host> ...`, so it binds, dials and is reachable only inside
the lab. Children are built as `mohawk_cli.cluster.LocalCluster` builds them (same modules, flags
and environment), with the host's addresses instead of 127.0.0.1.

Each service dials its own host's nats-server only: nats-py picks a random server from a list of
several, and a client left on a server whose host was cut off notices only when its pings go
unanswered (nats-py's default: 2 pings 120 s apart), so with every server listed, whether an
unplugged host stalls the others is chance (docs/security.md, "Hosts tested as hosts", says more).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from mohawk_cli.bus_identity import NATS_AUTH_DIR, issue_with_identity
from mohawk_common.bus import names
from mohawk_common.bus.config import BUNDLED_MODEL_NAME
from mohawk_common.bus.connect import CREDS_ENV, TLS_CA_ENV
from mohawk_common.bus.nats_auth import EVENTS_USER, NatsAuth, init_auth, resolver_block
from mohawk_common.bus.nats_tls import NatsCa, client_context, init_ca, issue_server
from mohawk_common.bus.server import find_nats_server
from mohawk_pqc.pki_files import init_pki
from tests.multihost.netns import Lab, call_in, wait_for

NATS_PORT = 4222
ROUTE_PORT = 6222
MONITOR_PORT = 8222
GATEWAY_PORT = 8000
MODEL = BUNDLED_MODEL_NAME
STOP_TIMEOUT_S = 15.0

_MODULES = {"coordinator": "mohawk_coordinator", "shard": "mohawk_shard", "gateway": "mohawk_gateway"}


@dataclass(frozen=True, slots=True)
class Service:
    name: str  # coordinator-1, shard-2, gateway
    role: str  # coordinator, shard, gateway: its certificate's role and its NATS user


def service(name: str) -> Service:
    return Service(name, name.split("-")[0])


class MultiHostCluster:
    """`layout`: host name -> the services it runs (a nats-server runs on every host)."""

    def __init__(self, lab: Lab, data_dir: Path, layout: Mapping[str, Sequence[str]]) -> None:
        self.lab = lab
        self.data_dir = data_dir
        self.layout = {host: [service(n) for n in names] for host, names in layout.items()}
        self.log_dir = data_dir / "logs"
        self.pki_dir = data_dir / "pki"
        self.auth = NatsAuth(self.pki_dir / NATS_AUTH_DIR)
        self.route_password = secrets.token_urlsafe(24)
        self.tls_ca = NatsCa(self.pki_dir / "nats-tls")  # made in start(): init_ca
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    # -- addresses ---------------------------------------------------------------------------
    def nats_url(self, host: str) -> str:
        return f"tls://{self.lab.host(host).address}:{NATS_PORT}"

    def nats_urls(self, first: str | None = None) -> list[str]:
        """Every server's URL, `first`'s own first (a service dials its host's server first)."""
        hosts = sorted(self.layout, key=lambda h: h != first)
        return [self.nats_url(h) for h in hosts]

    def creds(self, name: str) -> Path:
        """The NATS user of service `name` (in its bundle) or of a tool user (ops, admin)."""
        bundle = self.pki_dir / "nodes" / name / "nats.creds"
        return bundle if bundle.is_file() else self.auth.creds(name)

    def host_of(self, name: str) -> str:
        return next(h for h, services in self.layout.items() if any(s.name == name for s in services))

    @property
    def gateway_url(self) -> str:
        return f"http://{self.lab.host(self.host_of('gateway')).address}:{GATEWAY_PORT}"

    # -- starting ----------------------------------------------------------------------------
    def start(self) -> MultiHostCluster:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        init_pki(self.pki_dir)
        init_auth(self.auth.dir)
        init_ca(self.pki_dir)
        for host in self.layout:
            self._start_nats(host)
        wait_for(self.jetstream_has_leader, 30, "the 3-server JetStream cluster elects a meta leader")
        # The first coordinator makes the R3 streams and buckets before anyone else starts: a
        # service that asks for a bucket another is creating at that moment can get no answer
        # from JetStream and exit (see docs/security.md, "Hosts tested as hosts").
        services = [(h, s) for h, hosted in self.layout.items() for s in hosted]
        first = next((h, s) for h, s in services if s.role == "coordinator")
        self._start_service(*first)
        wait_for(self.leader_elected, 60, f"{first[1].name} holds the leader lease")
        rest = sorted(
            (hs for hs in services if hs != first),
            key=lambda hs: ("coordinator", "shard", "gateway").index(hs[1].role),
        )
        for host, svc in rest:
            self._start_service(host, svc)
        return self

    def _start_nats(self, host: str) -> None:
        address = self.lab.host(host).address
        store = self.data_dir / f"nats-{host}"
        store.mkdir(parents=True, exist_ok=True)
        include = os.path.relpath(self.auth.conf, store)
        tls = issue_server(self.tls_ca, store / "tls", [address])
        client_tls = os.path.relpath(tls.client_conf, store)
        route_tls = os.path.relpath(tls.route_conf, store)
        routes = [
            f"nats-route://route:{self.route_password}@{self.lab.host(other).address}:{ROUTE_PORT}"
            for other in self.layout
            if other != host
        ]
        config = store / "server.conf"
        config.write_text(
            f"server_name: nats-{host}\n"
            f"listen: {json.dumps(f'{address}:{NATS_PORT}')}\n"
            f"http: {json.dumps(f'{address}:{MONITOR_PORT}')}\n"
            f"jetstream {{ store_dir: {json.dumps(str(store / 'js'))} }}\n"
            f"include {json.dumps(include)}\n"
            + resolver_block(store / "jwt")
            + f"include {json.dumps(client_tls)}\n"
            "cluster {\n"
            "  name: mohawk\n"
            f"  include {json.dumps(route_tls)}\n"
            f"  listen: {json.dumps(f'{address}:{ROUTE_PORT}')}\n"
            f"  authorization {{ user: route, password: {json.dumps(self.route_password)} }}\n"
            f"  routes: [{', '.join(json.dumps(r) for r in routes)}]\n"
            "}\n"
        )
        self._spawn(f"nats-{host}", host, [find_nats_server(), "-c", str(config)], dict(os.environ))

    def jetstream_has_leader(self) -> bool:
        """Every server's /jsz names the same meta leader and sees a 3-server meta group."""
        leaders = set()
        for host in self.layout:
            jsz = self.monitor(host, "jsz")
            meta: Any = (jsz or {}).get("meta_cluster") or {}
            if not meta.get("leader") or meta.get("cluster_size", 0) < len(self.layout):
                return False
            leaders.add(meta["leader"])
        return len(leaders) == 1

    def leader_elected(self) -> bool:
        """Whether a coordinator holds the leader lease (its streams and buckets exist by then)."""
        if self.exited():
            name, code = next(iter(self.exited().items()))
            raise RuntimeError(f"{name} exited ({code}):\n{self.log_tail(name)}")

        async def read() -> bool:
            nc = Client()
            await nc.connect(self.nats_urls(), user_credentials=str(self.auth.creds("ops")),
                             tls=client_context(self.tls_ca.cert), allow_reconnect=False,
                             connect_timeout=10)  # fmt: skip
            try:
                kv = await nc.jetstream(timeout=2).key_value(names.LEADER_BUCKET)
                return bool((await kv.get(names.LEADER_KEY)).value)
            except Exception:  # no bucket or no key yet
                return False
            finally:
                await nc.close()

        host = next(iter(self.layout))
        return call_in(self.lab.host(host).netns, lambda: asyncio.run(read()), 15)

    def monitor(self, host: str, endpoint: str) -> dict[str, object] | None:
        """nats-server `host`'s monitoring endpoint, read from inside its namespace; None if unreachable."""
        url = f"http://{self.lab.host(host).address}:{MONITOR_PORT}/{endpoint}"

        def read() -> dict[str, object] | None:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    return dict(json.loads(response.read()))
            except (OSError, ValueError):
                return None

        return call_in(self.lab.host(host).netns, read, 10)

    def _start_service(self, host: str, svc: Service) -> None:
        bundle = self.pki_dir / "nodes" / svc.name
        if not (bundle / "nats.creds").is_file():  # a service restarted keeps its identity
            bundle = issue_with_identity(self.pki_dir, svc.name, svc.role, models=(MODEL,), days=30)
        args = ["--log-level", "info", "--pki-dir", str(bundle)]
        if svc.role == "coordinator":
            args += ["--coordinator-id", svc.name, "--state-dir", str(self.data_dir / "state" / svc.name)]
            args += ["--events-creds", str(self.auth.creds(EVENTS_USER))]
        elif svc.role == "shard":
            args += ["--node-id", svc.name, "--num-threads", "1"]
        else:
            args += ["--host", self.lab.host(host).address, "--port", str(GATEWAY_PORT)]
            args += ["--gateway-id", svc.name]
        env = {
            **os.environ,
            "MOHAWK_NATS_URL": self.nats_url(host),
            "MOHAWK_NATS_REPLICAS": "3",
            CREDS_ENV: str(bundle / "nats.creds"),
            TLS_CA_ENV: str(self.tls_ca.cert),
            "TRANSFORMERS_VERBOSITY": "error",
            "TOKENIZERS_PARALLELISM": "false",
        }
        self._spawn(svc.name, host, [sys.executable, "-m", _MODULES[svc.role], *args], env)

    def _spawn(self, name: str, host: str, command: Sequence[str], env: Mapping[str, str]) -> None:
        netns = self.lab.host(host).netns
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                ["ip", "netns", "exec", netns, *command],  # ip execs the command: the pid is the child's
                env=dict(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
            )

    # -- watching and stopping ---------------------------------------------------------------
    def exited(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.processes.items() if p.poll() is not None}

    def connections(self) -> dict[str, list[str]]:
        """Which clients each reachable nats-server holds, by connection name."""
        found = {}
        for host in self.layout:
            connz: Any = self.monitor(host, "connz")
            if connz is not None:
                found[host] = sorted(str(c.get("name", "?")) for c in connz.get("connections", []))
        return found

    def diagnosis(self) -> str:
        """Where each client is connected and each service's last log lines: for failure messages."""
        tails = (f"--- {name}\n{self.log_tail(name, 8)}" for name in self.processes)
        return f"connections: {self.connections()}\n" + "\n".join(tails)

    def log_tail(self, name: str, num_lines: int = 20) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:]) if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM every child (gateway, shards, coordinators, then NATS), SIGKILL what remains
        after STOP_TIMEOUT_S; never raises."""
        rank = {"gateway": 0, "shard": 1, "coordinator": 2, "nats": 3}
        order = sorted(self.processes, key=lambda n: rank.get(n.split("-")[0], 4))
        for name in order:
            if self.processes[name].poll() is None:
                self.processes[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for name in order:
            proc = self.processes[name]
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
