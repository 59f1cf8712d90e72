"""Redis across hosts: a redis-server with a password and TLS only (`RedisServer(tls=...)`, a
certificate from the bus CA, as `mohawk pki compose-bundles` issues one), against a real
redis-server: a client that trusts the bus CA and gives the password is served; one in plaintext,
one that trusts only the system's CAs and one without the password are refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.exceptions

from mohawk_cli.redis_server import RedisServer, ensure_password, find_redis_server
from mohawk_common.bus.nats_tls import LOCAL_HOSTS, init_ca, issue_server_certificate
from mohawk_common.tenancy import connect
from tests.real_parts import missing


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if find_redis_server() is None:
        missing("redis-server")
    root = tmp_path_factory.mktemp("redis-tls")
    tls = issue_server_certificate(init_ca(root / "pki"), root / "tls", LOCAL_HOSTS)
    password = ensure_password(root / "password")
    server = RedisServer(root / "data", persist=False, password=password, tls=tls).start()
    yield server
    server.stop()


def ping(url: str, password: str | None, tls_ca: Path | None) -> object:
    async def run() -> object:
        client = connect(url, password=password, tls_ca=tls_ca)
        try:
            return await client.ping()
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_a_client_trusting_the_bus_ca_with_the_password_is_served(server: RedisServer) -> None:
    assert server.url.startswith("rediss://") and server.public_url.startswith("rediss://127.0.0.1:")
    assert server.tls is not None
    assert ping(server.public_url, server.password, server.tls.ca) is True
    assert ping(server.url, None, server.tls.ca) is True  # the password in the URL works too


def test_plaintext_a_stranger_ca_and_no_password_are_refused(server: RedisServer, tmp_path: Path) -> None:
    assert server.tls is not None
    plaintext = server.public_url.replace("rediss://", "redis://")
    with pytest.raises(redis.exceptions.ConnectionError):
        ping(plaintext, server.password, None)
    other = init_ca(tmp_path / "other").cert
    for ca in (other, None):  # another CA, or the system's: the certificate does not verify
        with pytest.raises(redis.exceptions.ConnectionError, match=r"(?i)certificate verify failed"):
            ping(server.public_url, server.password, ca)
    with pytest.raises(redis.exceptions.AuthenticationError):
        ping(server.public_url, None, server.tls.ca)
