"""`mohawk pki compose-bundles DIR --model M`: one bundle, one NATS credential and the bus CA per
Compose service, the server's users and TLS certificate for NATS, and nothing of the root's or the
bus CA's private key."""

from __future__ import annotations

import asyncio
import stat
import subprocess
import time
from pathlib import Path

import pytest
import redis.exceptions
from cryptography import x509

from mohawk_cli.compose_bundles import SERVICES
from mohawk_cli.redis_server import find_redis_server
from mohawk_common.bus.nats_auth import CONF_NAME, NatsAuth
from mohawk_common.bus.nats_jwt import creds_jwt, creds_name, creds_subscriptions, decode_claims
from mohawk_common.bus.server import free_port
from mohawk_common.tenancy import connect
from mohawk_pqc.pki_files import load_bundle, read_message
from mohawk_proto.v1 import security_pb2
from tests.cli.helpers import mohawk_in_process
from tests.real_parts import missing

MODEL = "smollm2-135m-instruct"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return mohawk_in_process(capsys, "pki", *args)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def pki(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert cli(capsys, "init", "--pki-dir", str(tmp_path / "pki"))[0] == 0
    return tmp_path / "pki"


def test_each_service_gets_its_own_bundle_and_credential_and_no_root_key(
    pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundles"
    code, stdout, stderr = cli(capsys, "compose-bundles", str(out), "--model", MODEL, "--pki-dir", str(pki))
    assert code == 0, stderr
    assert "MOHAWK_HOST_ID=host1" in stderr
    assert {Path(line).name for line in stdout.split()} == {"nats", "redis", *(s.name for s in SERVICES)}
    assert "sudo chown -R 999" in stderr  # the redis image's user reads its config
    assert not list(out.rglob("root.key")) and not list(out.rglob("*.tmp"))
    assert not list(out.rglob("ca.key"))  # the bus CA's key stays in <pki-dir>/nats-tls
    ca = (pki / "nats-tls" / "ca.pem").read_bytes()
    users = {}
    for service in SERVICES:
        directory = out / service.name
        assert mode(directory) == 0o700
        creds = directory / "nats.creds"
        assert mode(creds) == 0o600
        users[service.name] = creds_name(creds.read_text())
        assert (directory / "nats-ca.pem").read_bytes() == ca  # MOHAWK_NATS_TLS_CA
        if service.cert_role is None:
            assert sorted(p.name for p in directory.iterdir()) == ["nats-ca.pem", "nats.creds", "root.pub"]
            assert (directory / "root.pub").read_bytes() == (pki / "root.pub").read_bytes()  # --trust-root
            continue
        bundle = load_bundle(directory / "pki", role=service.cert_role)  # valid now, for its role
        body = bundle.identity.body
        assert body.node_id == f"host1-{service.name}"  # docker-compose.yml's ids
        assert mode(directory / "pki" / "node.key") == 0o600
        # only the shard node holds the model's sealing key; shard and gateway are bound to the model
        seal_keys = list((directory / "pki" / "seal").rglob("*.key"))
        assert bool(seal_keys) == (service.cert_role == "shard")
        assert all(mode(key) == 0o600 for key in seal_keys)
        assert body.model == (MODEL if service.cert_role in ("shard", "gateway") else "")
    assert users == {s.name: f"host1-{s.name}" for s in SERVICES}  # one user per process, its id
    # the coordinator also hears the servers' connection advisories, and nothing else, as `events`
    events = out / "coordinator" / "events.creds"
    assert mode(events) == 0o600 and creds_name(events.read_text()) == "events"
    assert [p.name for p in out.rglob("events.creds")] == ["events.creds"]
    assert all(s.startswith("$SYS.ACCOUNT.") for s in creds_subscriptions(events.read_text()))
    # Redis's password: its config (a compose secret) and the gateway's copy, one per cluster
    password = (out / "gateway" / "redis-password").read_text().strip()
    assert len(password) >= 32 and mode(out / "gateway" / "redis-password") == 0o600
    conf = (out / "redis" / "redis.conf").read_text()
    assert f'requirepass "{password}"' in conf and "port 0" in conf and "tls-port 6379" in conf
    assert mode(out / "redis" / "redis.conf") == 0o600 and mode(out / "redis" / "server-key.pem") == 0o600
    assert (out / "redis" / "ca.pem").read_bytes() == ca  # gateways verify it with nats-ca.pem
    assert (pki / "redis-password").read_text().strip() == password
    serve_the_redis_conf(out / "redis", password, tmp_path)
    conf = out / "nats" / CONF_NAME
    assert mode(conf) == 0o600 and "operator:" in conf.read_text() and "SEED" not in conf.read_text()
    tls_files = ["ca.pem", "nats-tls.conf", "route-tls.conf", "server-key.pem", "server.pem"]
    assert sorted(p.name for p in (out / "nats").iterdir()) == sorted([CONF_NAME, *tls_files])
    assert mode(out / "nats" / "server-key.pem") == 0o600
    assert '"/etc/nats/auth/server.pem"' in (out / "nats" / "nats-tls.conf").read_text()  # its mount
    server = x509.load_pem_x509_certificate((out / "nats" / "server.pem").read_bytes())
    server.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["nats", "host1", "localhost"]  # compose, host


def serve_the_redis_conf(redis_dir: Path, password: str, tmp_path: Path) -> None:
    """The redis.conf compose-bundles wrote, run by a real redis-server (its container paths and
    port rewritten to here): TLS with the password, verified against the bus CA, is served."""
    if find_redis_server() is None:
        missing("redis-server")
    port = free_port()
    conf = (redis_dir / "redis.conf").read_text().replace("/etc/redis/tls", str(redis_dir))
    local = tmp_path / "redis-local.conf"
    local.write_text(conf.replace("tls-port 6379", f"tls-port {port}") + f'dir {tmp_path}\nsave ""\n')
    process = subprocess.Popen([str(find_redis_server()), str(local)], stdout=subprocess.DEVNULL)
    try:

        async def ping() -> object:
            client = connect(f"rediss://127.0.0.1:{port}/0", password=password, tls_ca=redis_dir / "ca.pem")
            try:
                return await client.ping()
            finally:
                await client.aclose()

        deadline = time.monotonic() + 10
        while True:
            try:
                assert asyncio.run(ping()) is True
                break
            except redis.exceptions.ConnectionError:
                assert time.monotonic() < deadline, "redis-server with the compose config did not answer"
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(10)


def test_a_second_host_gets_its_own_node_ids_and_nats_users_of_the_same_account(
    pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host1, host2 = tmp_path / "host1", tmp_path / "host2"
    for out, host in ((host1, "host1"), (host2, "host2")):
        args = ("compose-bundles", str(out), "--model", MODEL, "--host", host, "--pki-dir", str(pki))
        assert cli(capsys, *args)[0] == 0
    cert = read_message(host2 / "shard-node" / "pki" / "node.cert", security_pb2.Certificate)
    assert security_pb2.CertificateBody.FromString(cert.body).node_id == "host2-shard-node"
    account = NatsAuth(pki / "nats-auth").key("account").public_key  # one per cluster, kept there
    for service in SERVICES:
        users = [
            decode_claims(creds_jwt((h / service.name / "nats.creds").read_text())) for h in (host1, host2)
        ]
        assert [u["name"] for u in users] == [f"host1-{service.name}", f"host2-{service.name}"]
        assert {u["iss"] for u in users} == {account}  # both signed by the cluster's account
        assert (host1 / service.name / "nats-ca.pem").read_bytes() == (
            host2 / service.name / "nats-ca.pem"
        ).read_bytes()
    assert (host1 / "nats" / CONF_NAME).read_text() == (host2 / "nats" / CONF_NAME).read_text()


def test_a_rerun_replaces_what_was_there(
    pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundles"
    stale = out / "gateway" / "pki" / "seal" / "old-model.cert"
    stale.parent.mkdir(parents=True)
    stale.write_text("left over")
    (out / "nats").write_text("a file where a directory goes")
    assert cli(capsys, "compose-bundles", str(out), "--model", MODEL, "--pki-dir", str(pki))[0] == 0
    assert not stale.exists() and (out / "nats" / CONF_NAME).is_file()


def test_without_a_root_it_says_so_in_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundles"
    code, _, stderr = cli(
        capsys, "compose-bundles", str(out), "--model", MODEL, "--pki-dir", str(tmp_path / "none")
    )
    assert code == 2
    assert "root.key is missing" in stderr and len(stderr.strip().splitlines()) == 1
    assert not out.exists()
    code, _, stderr = cli(capsys, "compose-bundles", str(out), "--model", MODEL, "--host", "a/b")
    assert code == 2 and "--host" in stderr
