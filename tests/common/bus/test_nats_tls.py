"""TLS on the bus (`nats_tls`): the X.509 CA and server certificates it makes, and a real nats-server
with TLS and users that takes a role with the bus CA and its credential, and refuses a plaintext
client, a client that trusts another CA (or only the system's), and an anonymous one over TLS."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID

from mohawk_common.bus.connect import TLS_CA_ENV, connect
from mohawk_common.bus.nats_auth import NatsAuth, init_auth
from mohawk_common.bus.nats_jwt import creds_jwt
from mohawk_common.bus.nats_tls import LOCAL_HOSTS, NatsCa, init_ca, issue_server
from mohawk_common.bus.server import NatsServer

REFUSED_WITHIN_S = 5.0  # a refusal is final at once, not after nats-py's reconnect loop


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_the_ca_is_made_once_with_a_private_key_and_replaced_only_when_forced(tmp_path: Path) -> None:
    ca = init_ca(tmp_path / "pki")
    assert ca.dir == tmp_path / "pki" / "nats-tls"
    assert _mode(ca.key) == 0o600 and _mode(ca.dir) == 0o700
    cert = _cert(ca.cert)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert init_ca(tmp_path / "pki").cert.read_bytes() == ca.cert.read_bytes()  # kept
    assert init_ca(tmp_path / "pki", force=True).cert.read_bytes() != cert.public_bytes(Encoding.PEM)


def test_a_server_certificate_names_its_hosts_serves_and_routes_and_chains_to_the_ca(tmp_path: Path) -> None:
    ca = init_ca(tmp_path / "pki")
    server = issue_server(ca, tmp_path / "srv", ("nats-1", *LOCAL_HOSTS), seen_at="/etc/nats/tls")
    cert = _cert(server.cert)
    cert.verify_directly_issued_by(_cert(ca.cert))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["nats-1", "localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}  # routes
    assert cert.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=300)
    assert _mode(server.key) == 0o600
    assert server.ca.read_bytes() == ca.cert.read_bytes()
    assert not (server.dir / "ca.key").exists()  # the CA's key never goes where a server runs
    for conf in (server.client_conf, server.route_conf):
        text = conf.read_text()
        assert 'cert_file: "/etc/nats/tls/server.pem"' in text
        assert 'key_file: "/etc/nats/tls/server-key.pem"' in text
        assert 'ca_file: "/etc/nats/tls/ca.pem"' in text


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServer, NatsCa, NatsAuth]]:
    root = tmp_path_factory.mktemp("tls-bus")
    ca = init_ca(root / "pki")
    auth = init_auth(root / "auth")
    tls = issue_server(ca, root / "server", LOCAL_HOSTS)
    server = NatsServer(root / "nats", auth=auth, tls=tls, log_file=root / "nats.log").start()
    yield server, ca, auth
    server.stop()


def test_a_user_with_the_bus_ca_and_its_credential_is_served(
    bus: tuple[NatsServer, NatsCa, NatsAuth],
) -> None:
    server, ca, auth = bus
    assert server.url.startswith("tls://")

    async def scenario() -> None:
        nc = await connect(server.url, name="ops", attempts=1, creds=auth.creds("ops"), tls_ca=ca.cert)
        try:
            sub = await nc.subscribe("mohawk.v1.tel.test.x")
            await nc.flush()
            assert nc.is_connected and nc.connected_url is not None
        finally:
            await sub.unsubscribe()
            await nc.close()

    asyncio.run(scenario())


def test_the_ca_comes_from_the_environment_as_services_get_it(
    bus: tuple[NatsServer, NatsCa, NatsAuth], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, ca, auth = bus
    monkeypatch.setenv(TLS_CA_ENV, str(ca.cert))

    async def scenario() -> None:
        nc = await connect(server.url, name="ops", attempts=1, creds=auth.creds("ops"))
        await nc.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("trust", ["another CA", "the system's CAs"])
def test_a_client_that_does_not_trust_the_bus_ca_is_refused_at_once(
    bus: tuple[NatsServer, NatsCa, NatsAuth], tmp_path: Path, trust: str
) -> None:
    server, _, auth = bus
    other = init_ca(tmp_path / "other").cert if trust == "another CA" else None
    for url in (server.url, server.url.replace("tls://", "nats://")):  # nats-py upgrades either way
        start = time.monotonic()
        with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            asyncio.run(connect(url, name="stranger", attempts=1, creds=auth.creds("ops"), tls_ca=other))
        assert time.monotonic() - start < REFUSED_WITHIN_S


def test_an_anonymous_client_over_tls_is_still_refused(bus: tuple[NatsServer, NatsCa, NatsAuth]) -> None:
    server, ca, _ = bus
    with pytest.raises(ConnectionError, match=r"(?i)authorization violation"):
        asyncio.run(connect(server.url, name="anonymous", attempts=1, tls_ca=ca.cert))


def test_a_plaintext_client_is_refused(bus: tuple[NatsServer, NatsCa, NatsAuth]) -> None:
    """The server's greeting asks for TLS; a client that carries on in plaintext gets nothing back
    (no PONG, no error it could read) and its connection closed."""
    server, _, auth = bus
    credential = json.dumps({"jwt": creds_jwt(auth.creds("ops").read_text())})
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        info = sock.recv(4096)
        assert info.startswith(b"INFO ") and b'"tls_required":true' in info
        sock.sendall(b"CONNECT " + credential.encode() + b"\r\nPING\r\n")
        received = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(4096)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            received += chunk
        else:
            pytest.fail("the server kept a plaintext client's connection open")
    assert b"PONG" not in received and b"+OK" not in received
