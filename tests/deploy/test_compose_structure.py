"""docker-compose.yml's structure read from the YAML itself, so these say something where no Compose
is installed: the services `up` starts, Redis and NATS on volumes with health checks, one image for
Mohawk's services, the gateway's port, a scalable shard node, and commands the CLI parses."""

from __future__ import annotations

import re

import pytest

from tests.deploy.test_compose import (
    COMPOSE_FILE,
    DEV_FILE,
    MOHAWK_SERVICES,
    SERVERS,
    SERVICE_COMMANDS,
    env_of,
    mounts,
    published_ports,
    raw,
)


def test_services_are_exactly_the_running_ones() -> None:
    """`docker compose up` starts these; the rest belong to a profile (tests/deploy/test_observability.py)."""
    services = raw(COMPOSE_FILE)["services"]
    assert {name for name, service in services.items() if not service.get("profiles")} == {
        *SERVERS,
        *MOHAWK_SERVICES,
    }


def test_redis_keeps_an_append_only_file_on_a_volume_and_only_the_gateway_uses_it() -> None:
    document = raw(COMPOSE_FILE)
    services = document["services"]
    redis = services["redis"]
    assert re.fullmatch(r"redis:7(\.\d+)*(-alpine)?", redis["image"])
    command = redis["command"]
    assert (
        command[command.index("--appendonly") + 1] == "yes" and command[command.index("--dir") + 1] == "/data"
    )
    assert ("redis-data", "/data") in mounts(redis) and "redis-data" in document["volumes"]
    assert "ping" in " ".join(redis["healthcheck"]["test"])
    assert not redis.get("ports")  # not published: the gateways reach it on the compose network
    assert redis["restart"] == "unless-stopped"
    gateway = services["gateway"]
    env = env_of(gateway)
    assert env["MOHAWK_REDIS_URL"] == "${MOHAWK_REDIS_URL:-rediss://redis:6379/0}"
    assert env["MOHAWK_AUTH"] == "${MOHAWK_AUTH:-true}"
    assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"
    assert gateway["depends_on"]["nats"]["condition"] == "service_healthy"
    for name in MOHAWK_SERVICES - {"gateway"}:
        assert "MOHAWK_REDIS_URL" not in env_of(services[name]), name


def test_every_mohawk_service_shares_one_image_and_reaches_nats() -> None:
    services = raw(COMPOSE_FILE)["services"]
    images = {services[name]["image"] for name in MOHAWK_SERVICES}
    assert len(images) == 1
    for name in MOHAWK_SERVICES:
        service = services[name]
        assert "MOHAWK_NATS_URL" in env_of(service), name
        assert "MOHAWK_NATS_REPLICAS" in env_of(service), name
        assert service["build"]["context"] == "."
        assert service["command"][0] == SERVICE_COMMANDS[name]
        assert service["restart"] == "unless-stopped"
    assert services["nats"]["restart"] == "unless-stopped"


def test_nats_runs_jetstream_on_a_volume_with_a_healthcheck() -> None:
    document = raw(COMPOSE_FILE)
    nats = document["services"]["nats"]
    assert re.fullmatch(r"nats:2\.(\d+)-alpine", nats["image"])
    assert int(nats["image"].split(".")[1].split("-")[0]) >= 11
    command = nats["command"]
    assert "-js" in command and command[command.index("-sd") + 1] == "/data"
    assert ("nats-data", "/data") in mounts(nats)
    assert "nats-data" in document["volumes"]
    assert ("./config/nats/single.conf", "/etc/nats/nats-server.conf") in mounts(nats)
    assert "8222/healthz?js-enabled-only=true" in " ".join(nats["healthcheck"]["test"])
    assert ("4222", 4222) in published_ports(nats)


def test_gateway_publishes_8000_binds_all_interfaces_and_checks_health() -> None:
    gateway = raw(COMPOSE_FILE)["services"]["gateway"]
    assert ("8000", 8000) in published_ports(gateway)
    env = env_of(gateway)
    assert env["MOHAWK_HOST"] == "0.0.0.0"
    assert str(env["MOHAWK_PORT"]) == "8000"
    assert "/health" in " ".join(gateway["healthcheck"]["test"])


def test_shard_node_can_be_scaled_with_the_development_pki() -> None:
    """`--scale shard-node=N` needs no fixed name or host port, and a node id per replica: the
    production file names the one node its bundle certifies, the development override resets the
    id to the hostname (`null`)."""
    shard = raw(COMPOSE_FILE)["services"]["shard-node"]
    assert "container_name" not in shard
    assert "hostname" not in shard
    assert not shard.get("ports")
    assert env_of(shard)["MOHAWK_NODE_ID"] == "${MOHAWK_HOST_ID:-host1}-shard-node"
    assert env_of(raw(DEV_FILE)["services"]["shard-node"])["MOHAWK_NODE_ID"] == "null"


@pytest.mark.parametrize("name", sorted(MOHAWK_SERVICES))
def test_compose_commands_are_mohawk_subcommands(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The image's ENTRYPOINT is `mohawk`; each service's command, flags included, must parse."""
    from mohawk_cli.main import build_parser

    command = raw(COMPOSE_FILE)["services"][name]["command"]
    try:
        args = build_parser().parse_args(command)
    except SystemExit:
        pytest.fail(f"`mohawk {' '.join(command)}` (run by docker-compose.yml): {capsys.readouterr().err}")
    assert args.command == SERVICE_COMMANDS[name]
