"""The operator's commands on a bus that takes TLS only: `mohawk pki nats-tls` writes one directory per
server from the bus CA; `mohawk pki nats-auth DIR --tls NAME` adds one server's TLS to its users
(docker-compose.dev.yml); `mohawk pki revoke --nats-url` and `mohawk bus` reach such a server with
the CA named by MOHAWK_NATS_TLS_CA, as every service does, and without it are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from mohawk_common.bus.connect import TLS_CA_ENV
from mohawk_common.bus.nats_auth import NatsAuth
from mohawk_common.bus.nats_tls import ServerTls
from mohawk_common.bus.server import NatsServer
from mohawk_proto.v1 import security_pb2
from tests.cli.helpers import mohawk_in_process


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return mohawk_in_process(capsys, *args)


def test_nats_tls_writes_a_directory_per_server_named_for_its_mount(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, pki = tmp_path / "tls", tmp_path / "pki"
    servers = ("--server", "nats-1,10.0.0.1", "--server", "nats-2", "--server", "nats-3")
    code, stdout, err = cli(capsys, "pki", "nats-tls", str(out), *servers, "--pki-dir", str(pki))
    assert code == 0, err
    assert stdout.split() == [str(out / f"nats-{i}") for i in (1, 2, 3)]
    assert (pki / "nats-tls" / "ca.key").is_file() and not list(out.rglob("ca.key"))
    first = ServerTls(out / "nats-1")
    names = (
        x509.load_pem_x509_certificate(first.cert.read_bytes())
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert names.get_values_for_type(x509.DNSName) == ["nats-1", "localhost"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.1", "127.0.0.1"]
    assert '"/etc/nats/tls/server.pem"' in first.route_conf.read_text()  # the cluster compose mount


def test_revoke_and_bus_reach_a_tls_server_with_the_ca_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = tmp_path / "pki"
    bus_dir = pki / "nats-auth"  # the operator `pki issue` made for gw-1's user, with the TLS beside it
    assert cli(capsys, "pki", "init", "--pki-dir", str(pki))[0] == 0
    code, out, err = cli(
        capsys, "pki", "issue", "--node-id", "gw-1", "--role", "gateway", "--pki-dir", str(pki)
    )
    assert code == 0, err
    serial = str(
        security_pb2.CertificateBody.FromString(
            security_pb2.Certificate.FromString((pki / "nodes" / "gw-1" / "node.cert").read_bytes()).body
        ).serial
    )
    code, out, err = cli(capsys, "pki", "nats-auth", str(bus_dir), "--tls", "localhost")
    assert code == 0, err
    assert str(bus_dir / "nats-tls.conf") in out.split()
    auth, ca = NatsAuth(bus_dir), bus_dir / "nats-tls" / "ca.pem"
    server = NatsServer(tmp_path / "nats", auth=auth, tls=ServerTls(bus_dir)).start()
    try:
        revoke = ("pki", "revoke", "--serial", serial, "--pki-dir", str(pki), "--nats-url", server.url)
        admin = ("--creds", str(auth.creds("admin")))
        code, _, err = cli(capsys, *revoke, *admin)  # no CA: the system's CAs never signed it
        assert code == 1 and "CERTIFICATE_VERIFY_FAILED" in err, err
        monkeypatch.setenv(TLS_CA_ENV, str(ca))
        code, out, err = cli(capsys, *revoke, *admin)
        assert code == 0, err
        assert out.strip() == "2"
        code, out, err = cli(
            capsys, "bus", "--creds", str(auth.creds("ops")), "streams", "--nats-url", server.url
        )
        assert code == 0, err
        assert "KV_mohawk_pki" in out
    finally:
        server.stop()
