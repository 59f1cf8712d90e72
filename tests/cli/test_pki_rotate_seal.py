"""`mohawk pki revoke --nats-url` and `mohawk pki rotate-seal` rotate a model's sealing key on a real
nats-server: the record lands in mohawk_pki under the model's key, numbered past the last one, with
a copy for each shard that keeps the key and none for the revoked one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import NatsServer
from mohawk_pqc.pki_files import load_bundle
from mohawk_proto.v1 import security_pb2
from tests.cli.helpers import mohawk_in_process

MODEL = "SmolLM2-135M"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return mohawk_in_process(capsys, "pki", *args)


def serial_of(bundle: Path) -> int:
    return load_bundle(
        bundle, role="gateway" if bundle.name.startswith("gw") else "shard"
    ).identity.body.serial


def published(url: str) -> security_pb2.SealKeyRecordBody:
    async def read() -> bytes:
        nc = await connect(url, name="test", attempts=3)
        try:
            kv = await nc.jetstream().key_value(names.PKI_BUCKET)
            entry = await kv.get(names.seal_key_record_key(MODEL))
            assert entry.value is not None
            return entry.value
        finally:
            await nc.close()

    return security_pb2.SealKeyRecordBody.FromString(
        security_pb2.SealKeyRecord.FromString(asyncio.run(read())).body
    )


@pytest.fixture
def pki(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    pki = tmp_path / "pki"
    for args in (
        ("init",),
        *(("issue", "--node-id", node, "--role", "shard", "--model", MODEL) for node in ("kept", "gone")),
        ("issue", "--node-id", "gw-1", "--role", "gateway", "--model", MODEL),
    ):
        code, _, err = cli(capsys, *args, "--pki-dir", str(pki))
        assert code == 0, err
    return pki


def test_revoking_a_shard_rotates_its_models_key_and_rotate_seal_rotates_again(
    pki: Path, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ("--pki-dir", str(pki), "--nats-url", nats_server.url)
    code, out, err = cli(capsys, "revoke", "--serial", str(serial_of(pki / "nodes" / "gone")), *flags)
    assert code == 0, err
    assert out.strip() == "2"  # the revocation list's number, as before
    first = published(nats_server.url)
    assert first.number == 1
    assert [c.recipient_serial for c in first.copies] == [serial_of(pki / "nodes" / "kept")]
    assert load_bundle(pki / "nodes" / "gw-1", role="gateway").seal_cert_for(MODEL) == first.certificate

    code, out, err = cli(capsys, "rotate-seal", "--model", MODEL, *flags)
    assert code == 0, err
    second = published(nats_server.url)
    assert out.split() == [MODEL, "2", "copies=1"] and second.number == 2
    assert second.certificate != first.certificate

    code, _, err = cli(capsys, "revoke", "--serial", str(serial_of(pki / "nodes" / "gw-1")), *flags)
    assert code == 0, err
    assert published(nats_server.url).number == 2  # a gateway never held the key: nothing rotates


def test_rotate_seal_of_a_model_without_a_key_is_one_line(
    pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(
        capsys, "rotate-seal", "--model", "nope", "--pki-dir", str(pki), "--nats-url", "nats://x"
    )
    assert code == 2 and out == ""
    assert "no sealing key of model(s) nope" in err and len(err.strip().splitlines()) == 1
