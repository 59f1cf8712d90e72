"""`mohawk pki` as an operator runs it: init, issue, show, revoke (also onto a real NATS), and errors."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.nats_auth import NatsAuth
from mohawk_common.bus.server import NatsServer, free_port
from mohawk_pqc.certificates import Root, TrustStore
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.pki_files import load_bundle
from mohawk_proto.v1 import security_pb2
from tests.cli.helpers import mohawk as run_mohawk
from tests.cli.helpers import mohawk_in_process

MODEL = "SmolLM2-135M"


def mohawk(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`mohawk pki ARGS` as a user runs it."""
    return run_mohawk("pki", *args, timeout=timeout)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`mohawk pki ...` in this process: exit status, stdout, stderr."""
    return mohawk_in_process(capsys, "pki", *args)


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def root_of(pki: Path) -> Root:
    return Root(security_pb2.RootPublicKey.FromString((pki / "root.pub").read_bytes()))


def serial_of(bundle: Path) -> int:
    return security_pb2.CertificateBody.FromString(
        security_pb2.Certificate.FromString((bundle / "node.cert").read_bytes()).body
    ).serial


@pytest.fixture
def pki(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A PKI with a root, shard-1 (holding the model's sealing key) and gw-1."""
    pki = tmp_path / "pki"
    for args in (
        ("init",),
        ("issue", "--node-id", "shard-1", "--role", "shard", "--model", MODEL),
        ("issue", "--node-id", "gw-1", "--role", "gateway", "--model", MODEL, "--days", "30"),
    ):
        code, _, err = cli(capsys, *args, "--pki-dir", str(pki))
        assert code == 0, err
    return pki


@pytest.mark.slow  # over 5 s here: the inner loop leaves it to `make test`
def test_init_issue_show_revoke_as_a_subprocess(tmp_path: Path) -> None:
    pki = str(tmp_path / "pki")
    init = mohawk("init", "--pki-dir", pki)
    assert init.returncode == 0, init.stderr
    assert init.stdout.strip() == root_of(Path(pki)).issuer[:16].hex()

    issue = mohawk("issue", "--node-id", "shard-1", "--role", "shard", "--model", MODEL, "--pki-dir", pki)
    assert issue.returncode == 0, issue.stderr
    path, description = issue.stdout.strip().splitlines()
    assert Path(path) == Path(pki) / "nodes" / "shard-1"
    assert description.startswith("shard-1 role=shard serial=")
    bundle = load_bundle(Path(path), role="shard")
    assert bundle.seal_key_for(MODEL) is not None
    assert f"serial={bundle.identity.body.serial} " in description

    revoke = mohawk("revoke", "--serial", str(bundle.identity.body.serial), "--pki-dir", pki)
    assert revoke.returncode == 0, revoke.stderr
    assert revoke.stdout.strip() == "2"

    show = mohawk("show", "--pki-dir", pki)
    assert show.returncode == 0, show.stderr
    assert "shard-1 role=shard" in show.stdout and "[revoked]" in show.stdout
    assert "Traceback" not in show.stderr


def test_show_lists_root_bundles_and_revocations(pki: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "show", "--pki-dir", str(pki))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"root {root_of(pki).issuer[:16].hex()}")
    assert lines[1] == "revocation list 1: revoked serials none"
    nodes = {line.split()[1]: line for line in lines if line.startswith("node ")}
    assert set(nodes) == {"shard-1", "gw-1"}
    assert "role=gateway" in nodes["gw-1"] and nodes["gw-1"].endswith("[ok]")
    assert any(line.startswith("seal ") and f"model={MODEL}" in line for line in lines)

    serial = serial_of(pki / "nodes" / "gw-1")
    code, out, _ = cli(capsys, "revoke", "--serial", str(serial), "--pki-dir", str(pki))
    assert (code, out.strip()) == (0, "2")
    code, out, _ = cli(capsys, "show", "--pki-dir", str(pki))
    assert f"revocation list 2: revoked serials {serial}" in out
    gateway = next(line for line in out.splitlines() if line.startswith("node gw-1"))
    assert gateway.endswith("[revoked]")
    assert next(line for line in out.splitlines() if line.startswith("node shard-1")).endswith("[ok]")


def test_revoke_writes_a_list_a_trust_store_adopts(pki: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = serial_of(pki / "nodes" / "shard-1"), serial_of(pki / "nodes" / "gw-1")
    assert cli(capsys, "revoke", "--serial", str(a), "--pki-dir", str(pki))[0] == 0
    code, out, _ = cli(capsys, "revoke", "--serial", str(b), "--serial", str(a), "--pki-dir", str(pki))
    assert (code, out.strip()) == (0, "3")
    trust = TrustStore(root_of(pki))
    assert trust.update_revocations(security_pb2.RevocationList.FromString((pki / "crl").read_bytes()))
    assert trust.crl_number == 3 and trust.revoked == {a, b}


def test_issue_gives_a_gateway_no_sealing_key(pki: Path) -> None:
    assert list((pki / "nodes" / "shard-1" / "seal").glob("*.key"))
    assert not list((pki / "nodes" / "gw-1" / "seal").glob("*.key"))
    assert load_bundle(pki / "nodes" / "gw-1", role="gateway").seal_cert_for(MODEL) is not None


def test_init_force_replaces_the_root(pki: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = root_of(pki).issuer
    code, out, _ = cli(capsys, "init", "--force", "--pki-dir", str(pki))
    assert code == 0 and out.strip() == root_of(pki).issuer[:16].hex() != before[:16].hex()
    code, out, _ = cli(capsys, "show", "--pki-dir", str(pki))
    assert code == 0
    assert all(line.endswith(("[untrusted]", "[tampered]")) for line in out.splitlines()[2:]), out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("show",), "root.pub is missing"),
        (("issue", "--node-id", "n1", "--role", "shard"), "root.key is missing"),
        (("revoke", "--serial", "5"), "root.key is missing"),
        (("issue", "--node-id", "../escape", "--role", "shard"), "node id"),
        (("issue", "--node-id", "n1", "--role", "admin"), "--role"),
        (("issue", "--node-id", "n1", "--role", "shard", "--days", "0"), "--days"),
        (("issue", "--node-id", "n1"), "--role"),
        (("revoke", "--serial", "x"), "--serial"),
        (("revoke",), "--serial"),
        ((), "required"),
    ],
    ids=[
        "show-before-init",
        "issue-before-init",
        "revoke-before-init",
        "node-id-path",
        "unknown-role",
        "zero-days",
        "no-role",
        "serial-not-a-number",
        "no-serial",
        "no-subcommand",
    ],
)
def test_errors_without_a_pki_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], needle: str
) -> None:
    code, out, err = cli(capsys, *args, *(("--pki-dir", str(tmp_path / "none")) if args else ()))
    assert code == 2 and out == ""
    assert needle in one_line(err)
    assert not (tmp_path / "none" / "nodes").exists()


def test_errors_with_a_pki_are_one_line(pki: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flag = ("--pki-dir", str(pki))
    code, _, err = cli(capsys, "init", *flag)
    assert code == 2 and "--force" in one_line(err)
    code, _, err = cli(capsys, "revoke", "--serial", "12345", *flag)
    assert code == 2 and "never issued serial(s) 12345" in one_line(err)
    assert (
        security_pb2.RevocationListBody.FromString(
            security_pb2.RevocationList.FromString((pki / "crl").read_bytes()).body
        ).number
        == 1
    )  # nothing was revoked
    (pki / "root.pub").write_bytes(b"\xff\xff\xff")
    code, _, err = cli(capsys, "show", *flag)
    assert code == 2 and "root.pub cannot be read" in one_line(err)


def test_an_unwritable_pki_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("not a directory")
    code, _, err = cli(capsys, "init", "--pki-dir", str(tmp_path / "file" / "pki"))
    assert code == 2 and "file" in one_line(err)


def test_an_error_in_a_subprocess_is_one_line_and_status_2(tmp_path: Path) -> None:
    result = mohawk("issue", "--node-id", "n1", "--role", "shard", "--pki-dir", str(tmp_path))
    assert result.returncode == 2 and result.stdout == ""
    assert "root.key is missing" in one_line(result.stderr)


def test_revoke_publishes_the_list_on_nats(pki: Path, nats_server: NatsServer) -> None:
    """A real nats-server: the list lands in the PKI bucket, and a node's trust store adopts it."""
    serial = serial_of(pki / "nodes" / "gw-1")
    result = mohawk("revoke", "--serial", str(serial), "--pki-dir", str(pki), "--nats-url", nats_server.url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"

    async def read_crl() -> bytes:
        nc = await connect(nats_server.url, name="test", attempts=3)
        try:
            kv = await (nc.jetstream()).key_value(names.PKI_BUCKET)
            entry = await kv.get(names.CRL_KEY)
            assert entry.value is not None
            return entry.value
        finally:
            await nc.close()

    published = asyncio.run(read_crl())
    assert published == (pki / "crl").read_bytes()
    # a running node holds the list it was issued with (number 1) and adopts the published one
    node = load_bundle(pki / "nodes" / "shard-1", role="shard")
    gateway_cert = load_bundle(pki / "nodes" / "gw-1", role="gateway").identity.certificate
    assert node.trust.crl_number == 1
    node.trust.verify(gateway_cert)
    assert node.trust.update_revocations(security_pb2.RevocationList.FromString(published))
    with pytest.raises(AuthenticationError) as caught:
        node.trust.verify(gateway_cert)
    assert caught.value.reason == "revoked"


@pytest.mark.slow  # over 5 s here: the inner loop leaves it to `make test`
def test_revoke_with_nats_unreachable_changes_nothing(pki: Path) -> None:
    serial = serial_of(pki / "nodes" / "gw-1")
    before = (pki / "crl").read_bytes()
    result = mohawk(
        "revoke",
        "--serial",
        str(serial),
        "--pki-dir",
        str(pki),
        "--nats-url",
        f"nats://127.0.0.1:{free_port()}",
    )
    assert result.returncode == 1 and result.stdout == ""
    assert "cannot reach NATS" in one_line(result.stderr)
    assert (pki / "crl").read_bytes() == before


def test_nats_auth_makes_users_and_revoke_publishes_as_admin(
    pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`mohawk pki nats-auth DIR` writes the server's include file and the tools' users (and
    `--user` a process's); a nats-server using it refuses an anonymous revoke and takes the
    admin's."""
    auth_dir = pki / "nats-auth"  # where `pki issue` made the operator for gw-1's user
    code, out, err = cli(capsys, "nats-auth", str(auth_dir), "--user", "tel-1:telemetry")
    assert code == 0, err
    auth = NatsAuth(auth_dir)
    assert out.split() == [str(auth.conf), *(str(auth.creds(u)) for u in ("ops", "admin", "tel-1"))]
    server = NatsServer(tmp_path / "nats", auth=auth).start()
    try:
        serial = str(serial_of(pki / "nodes" / "gw-1"))
        args = ("revoke", "--serial", serial, "--pki-dir", str(pki), "--nats-url", server.url)
        code, _, err = cli(capsys, *args)
        assert code == 1 and "Authorization Violation" in one_line(err)
        assert not (pki / "crl.2").exists()
        code, out, err = cli(capsys, *args, "--creds", str(auth.creds("admin")))
        assert code == 0, err
        assert out.strip() == "2"
    finally:
        server.stop()
