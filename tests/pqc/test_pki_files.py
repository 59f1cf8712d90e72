"""The PKI on disk: what `mohawk pki` writes and what a service refuses to start with."""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from pathlib import Path

import pytest

from mohawk_pqc.certificates import Root, TrustStore, read_body
from mohawk_pqc.errors import PkiError
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.pki_files import DAY_S, describe, init_pki, issue_node, load_bundle, revoke
from mohawk_pqc.seal import open_sealed, seal
from mohawk_proto.v1 import security_pb2

MODEL = "SmolLM2-135M"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    init_pki(tmp_path / "pki")
    return tmp_path / "pki"


def test_init_issue_load_round_trip(pki: Path) -> None:
    root = Root(security_pb2.RootPublicKey.FromString((pki / "root.pub").read_bytes()))
    path = issue_node(pki, "shard-1", "shard", models=(MODEL,))
    assert path == pki / "nodes" / "shard-1"
    bundle = load_bundle(path, role="shard")
    assert bundle.identity.node_id == "shard-1" and bundle.identity.body.role == "shard"
    assert bundle.trust.root.issuer == root.issuer and bundle.trust.crl_number == 1
    assert bundle.identity.signing_key.verify_key().ecdsa_public == bundle.identity.body.ecdsa_p256_public
    assert "shard-1 role=shard serial=" in describe(bundle.identity.certificate)


def test_serials_are_unique_and_recorded(pki: Path) -> None:
    serials = [
        load_bundle(issue_node(pki, f"gw-{i}", "gateway"), role="gateway").identity.body.serial
        for i in range(3)
    ]
    assert len(set(serials)) == 3
    recorded = [int(line) for line in (pki / "serials").read_text().split()]
    assert set(serials) <= set(recorded)


def test_a_shard_bundle_holds_the_models_seal_key_and_a_gateway_only_the_cert(pki: Path) -> None:
    shard = load_bundle(issue_node(pki, "shard-1", "shard", models=(MODEL,)), role="shard")
    gateway = load_bundle(issue_node(pki, "gw-1", "gateway", models=(MODEL,)), role="gateway")
    seal_cert, seal_key = gateway.seal_cert_for(MODEL), shard.seal_key_for(MODEL)
    assert seal_cert is not None and seal_key is not None
    assert gateway.seal_key_for(MODEL) is None
    assert not list((pki / "nodes" / "gw-1" / "seal").glob("*.key"))
    assert read_body(seal_cert).role == "seal" and read_body(seal_cert).model == MODEL
    # what the gateway seals to the model, the shard opens
    envelope = seal(read_body(seal_cert), b"prompt", b"req-1", CryptographyKem())
    assert open_sealed(seal_key, envelope, b"req-1") == b"prompt"
    # one sealing key per model, shared by all its shard nodes
    other_shard = load_bundle(issue_node(pki, "shard-2", "shard", models=(MODEL,)), role="shard")
    other_key = other_shard.seal_key_for(MODEL)
    assert other_key is not None and other_key.mlkem_public == seal_key.mlkem_public


def test_shard_and_gateway_certificates_of_one_model_are_bound_to_it(pki: Path) -> None:
    def model_of(node_id: str, role: str, models: tuple[str, ...]) -> str:
        return load_bundle(issue_node(pki, node_id, role, models=models), role=role).identity.body.model

    assert model_of("shard-1", "shard", (MODEL,)) == MODEL
    assert model_of("gw-1", "gateway", (MODEL,)) == MODEL
    assert model_of("coord-1", "coordinator", (MODEL,)) == ""  # plans every model
    assert model_of("shard-2", "shard", (MODEL, "other")) == ""  # several models: any
    assert model_of("shard-3", "shard", ()) == ""


def test_private_keys_are_mode_0600(pki: Path) -> None:
    path = issue_node(pki, "shard-1", "shard", models=(MODEL,))
    for key in [
        pki / "root.key",
        path / "node.key",
        *(path / "seal").glob("*.key"),
        *(pki / "seal").glob("*.key"),
    ]:
        assert mode(key) == 0o600, key
    assert mode(path / "node.cert") & 0o077 != 0o000  # public files stay readable


def test_a_leftover_tmp_or_a_loose_umask_never_makes_a_private_key_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupted write leaves `root.key.tmp` behind with whatever mode it had; one planted as
    a link points elsewhere. Neither may decide the key's mode, nor receive the key."""
    pki = tmp_path / "pki"
    pki.mkdir()
    leftover = pki / "root.key.tmp"
    leftover.write_bytes(b"old")
    leftover.chmod(0o666)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"untouched")
    (pki / "nodes" / "shard-1").mkdir(parents=True)
    (pki / "nodes" / "shard-1" / "node.key.tmp").symlink_to(elsewhere)
    (pki / "nodes" / "shard-1" / "node.key").write_bytes(b"old key")
    (pki / "nodes" / "shard-1" / "node.key").chmod(0o644)
    old_umask = os.umask(0)  # nothing masked: a mode of 0644 given at open would stay 0644
    try:
        init_pki(pki)
        path = issue_node(pki, "shard-1", "shard", models=(MODEL,))
    finally:
        os.umask(old_umask)
    assert mode(pki / "root.key") == 0o600
    assert mode(path / "node.key") == 0o600 and not (path / "node.key").is_symlink()
    assert elsewhere.read_bytes() == b"untouched"
    assert not leftover.exists() and not (path / "node.key.tmp").exists()
    load_bundle(path, role="shard")  # what was written is the key, whole


def test_an_expired_certificate_is_refused(pki: Path) -> None:
    path = issue_node(pki, "shard-1", "shard", not_before=time.time() - 30 * DAY_S, days=1)
    with pytest.raises(PkiError, match="expired"):
        load_bundle(path, role="shard")


def test_a_not_yet_valid_certificate_is_refused(pki: Path) -> None:
    path = issue_node(pki, "shard-1", "shard", not_before=time.time() + 2 * DAY_S, days=10)
    with pytest.raises(PkiError, match="expired"):
        load_bundle(path, role="shard")


def test_a_certificate_for_another_role_is_refused(pki: Path) -> None:
    path = issue_node(pki, "gw-1", "gateway")
    with pytest.raises(PkiError, match="not a valid shard certificate"):
        load_bundle(path, role="shard")


def test_a_bundle_whose_root_is_another_roots_is_refused(pki: Path, tmp_path: Path) -> None:
    path = issue_node(pki, "shard-1", "shard")
    init_pki(tmp_path / "other")
    shutil.copyfile(tmp_path / "other" / "root.pub", path / "root.pub")
    with pytest.raises(PkiError, match="not signed by this root"):
        load_bundle(path, role="shard")
    (path / "crl").unlink()  # without the list, the certificate itself is refused
    with pytest.raises(PkiError, match="not a valid shard certificate"):
        load_bundle(path, role="shard")


def test_a_key_of_another_node_is_refused(pki: Path) -> None:
    a, b = issue_node(pki, "shard-1", "shard"), issue_node(pki, "shard-2", "shard")
    shutil.copyfile(b / "node.key", a / "node.key")
    with pytest.raises(PkiError, match="does not belong to"):
        load_bundle(a, role="shard")


@pytest.mark.parametrize("field", ["mldsa65_seed", "x25519_private", "mlkem768_seed"])
def test_a_key_that_matches_only_partly_is_refused(pki: Path, field: str) -> None:
    """The ECDSA key alone matching is not enough: every private key must match the certificate."""
    a, b = issue_node(pki, "shard-1", "shard"), issue_node(pki, "shard-2", "shard")
    mine = security_pb2.PrivateKeyBundle.FromString((a / "node.key").read_bytes())
    theirs = security_pb2.PrivateKeyBundle.FromString((b / "node.key").read_bytes())
    setattr(mine, field, getattr(theirs, field))
    (a / "node.key").write_bytes(mine.SerializeToString())
    with pytest.raises(PkiError, match="does not belong to"):
        load_bundle(a, role="shard")


def test_a_seal_key_of_another_model_is_refused(pki: Path) -> None:
    path = issue_node(pki, "shard-1", "shard", models=(MODEL, "other"))
    seal_dir = path / "seal"
    shutil.copyfile(seal_dir / "other.key", seal_dir / "smollm2-135m.key")
    with pytest.raises(PkiError, match="does not belong"):
        load_bundle(path, role="shard")


@pytest.mark.parametrize("damage", ["garbage", "empty-fields"])
def test_an_unusable_key_file_is_a_pki_error(pki: Path, damage: str) -> None:
    path = issue_node(pki, "shard-1", "shard")
    (path / "node.key").write_bytes(
        b"\xff\xfe\x00" if damage == "garbage" else security_pb2.PrivateKeyBundle().SerializeToString()
    )
    with pytest.raises(PkiError, match=r"node\.key"):
        load_bundle(path, role="shard")


@pytest.mark.parametrize("name", ["root.pub", "node.cert", "node.key"])
def test_a_missing_file_is_named(pki: Path, name: str) -> None:
    path = issue_node(pki, "shard-1", "shard")
    (path / name).unlink()
    with pytest.raises(PkiError, match=re.escape(f"{name} is missing")):
        load_bundle(path, role="shard")


def test_revoke_writes_a_newer_list_that_a_store_adopts(pki: Path) -> None:
    path = issue_node(pki, "shard-1", "shard")
    serial = load_bundle(path, role="shard").identity.body.serial
    crl = revoke(pki, [serial])
    body = security_pb2.RevocationListBody.FromString(crl.body)
    assert body.number == 2 and list(body.serials) == [serial]
    assert (pki / "crl").read_bytes() == crl.SerializeToString(deterministic=True)
    again = security_pb2.RevocationListBody.FromString(revoke(pki, [7]).body)
    assert again.number == 3 and set(again.serials) == {serial, 7}  # old serials stay revoked
    root = Root(security_pb2.RootPublicKey.FromString((pki / "root.pub").read_bytes()))
    trust = TrustStore(root)
    assert trust.update_revocations(crl) and trust.crl_number == 2
    # a bundle handed the new list no longer loads
    shutil.copyfile(pki / "crl", path / "crl")
    with pytest.raises(PkiError, match="revoked"):
        load_bundle(path, role="shard")


def test_init_refuses_to_replace_a_root_unless_forced(pki: Path) -> None:
    before = (pki / "root.pub").read_bytes()
    with pytest.raises(PkiError, match="--force"):
        init_pki(pki)
    assert (pki / "root.pub").read_bytes() == before
    init_pki(pki, force=True)
    assert (pki / "root.pub").read_bytes() != before


@pytest.mark.parametrize("role", ["seal", "admin", ""])
def test_issue_refuses_other_roles(pki: Path, role: str) -> None:
    with pytest.raises(PkiError, match="role"):
        issue_node(pki, "x", role)


def test_issue_without_a_root_is_a_pki_error(tmp_path: Path) -> None:
    with pytest.raises(PkiError, match=r"root\.key is missing"):
        issue_node(tmp_path, "shard-1", "shard")
