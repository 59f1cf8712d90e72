"""Sealing-key records: signed by the root over the whole, opened only by the shard nodes listed,
numbered so that an older record never wins; a keyring keeps the key it replaces only for the
window it is given; the operator's rotation on disk leaves the revoked node out."""

from __future__ import annotations

from pathlib import Path

import pytest

from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.identity import Identity
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.pki_files import (
    init_pki,
    issue_node,
    load_bundle,
    models_held_by,
    revoke,
    rotate_seal_key,
    seal_record_number,
)
from mohawk_pqc.seal import open_sealed, seal
from mohawk_pqc.seal_keys import (
    SealKeyring,
    open_seal_key_copy,
    sign_seal_key_record,
    verify_seal_key_record,
)
from mohawk_proto.v1 import security_pb2
from tests.pqc.helpers import NOW, Clock, ScratchPki

MODEL = "m"
KEEP_S = 600.0


def record(
    pki: ScratchPki, seal_key: Identity, recipients: list[Identity], number: int
) -> security_pb2.SealKeyRecord:
    bodies = [r.body for r in recipients]
    return sign_seal_key_record(pki.root_key, seal_key, bodies, CryptographyKem(), number=number, now=NOW)


@pytest.fixture
def pki() -> ScratchPki:
    return ScratchPki(Clock())


def test_a_record_verifies_and_each_listed_shard_opens_the_certified_key(pki: ScratchPki) -> None:
    seal_key = pki.identity("seal-m", "seal", model=MODEL)
    shard_a, shard_b = pki.identity("a"), pki.identity("b")
    body = verify_seal_key_record(record(pki, seal_key, [shard_a, shard_b], 3), pki.trust())
    assert (body.model, body.number) == (MODEL, 3)
    for shard in (shard_a, shard_b):
        keys = open_seal_key_copy(body, shard)
        envelope = seal(seal_key.body, b"prompt", b"aad", CryptographyKem())
        assert open_sealed(keys, envelope, b"aad") == b"prompt"


def test_a_node_left_off_the_record_gets_no_copy(pki: ScratchPki) -> None:
    seal_key = pki.identity("seal-m", "seal", model=MODEL)
    kept, revoked = pki.identity("kept"), pki.identity("revoked")
    body = verify_seal_key_record(record(pki, seal_key, [kept], 2), pki.trust())
    with pytest.raises(AuthenticationError) as info:
        open_seal_key_copy(body, revoked)
    assert info.value.reason == "untrusted"


def test_a_copy_addressed_to_a_node_opens_for_no_one_else(pki: ScratchPki) -> None:
    """Relabel kept's copy with the other node's serial (the root re-signs, as a careless operator
    tool might): the other node's keys still cannot open it."""
    seal_key = pki.identity("seal-m", "seal", model=MODEL)
    kept, other = pki.identity("kept"), pki.identity("other")
    body = verify_seal_key_record(record(pki, seal_key, [kept], 2), pki.trust())
    body.copies[0].recipient_serial = other.body.serial
    with pytest.raises(AuthenticationError) as info:
        open_seal_key_copy(body, other)
    assert info.value.reason == "tampered"


def test_a_copy_moved_into_another_record_does_not_open(pki: ScratchPki) -> None:
    """Copies are bound to their model, number and key: one lifted from record 2 into record 3 fails."""
    seal_key = pki.identity("seal-m", "seal", model=MODEL)
    shard = pki.identity("a")
    two = verify_seal_key_record(record(pki, seal_key, [shard], 2), pki.trust())
    three = verify_seal_key_record(record(pki, seal_key, [], 3), pki.trust())
    three.copies.append(two.copies[0])
    with pytest.raises(AuthenticationError) as info:
        open_seal_key_copy(three, shard)
    assert info.value.reason == "tampered"


def test_a_record_not_signed_by_the_root_is_refused(pki: ScratchPki) -> None:
    seal_key = pki.identity("seal-m", "seal", model=MODEL)
    shard = pki.identity("a")
    good = record(pki, seal_key, [shard], 2)
    flipped = security_pb2.SealKeyRecord()
    flipped.CopyFrom(good)
    flipped.body = good.body[:-1] + bytes([good.body[-1] ^ 1])
    other_root = ScratchPki(pki.clock)
    foreign = record(other_root, other_root.identity("seal-m", "seal", model=MODEL), [shard], 9)
    for bad in (flipped, foreign):
        with pytest.raises(AuthenticationError) as info:
            verify_seal_key_record(bad, pki.trust())
        assert info.value.reason == "tampered"


def test_a_record_whose_certificate_is_not_a_sealing_key_of_its_model_is_refused(pki: ScratchPki) -> None:
    shard = pki.identity("a")
    for wrong in (pki.identity("seal-x", "seal", model="other"), pki.identity("gw", "gateway", model=MODEL)):
        signed = sign_seal_key_record(pki.root_key, wrong, [shard.body], CryptographyKem(), number=2, now=NOW)
        body = security_pb2.SealKeyRecordBody.FromString(signed.body)
        body.model = MODEL
        data = body.SerializeToString(deterministic=True)
        relabelled = security_pb2.SealKeyRecord(
            body=data, signature=pki.root_key.sign(b"seal-key-record", data)
        )
        with pytest.raises(AuthenticationError) as info:
            verify_seal_key_record(relabelled, pki.trust())
        assert info.value.reason == "untrusted"


def test_a_keyring_takes_only_newer_numbers(pki: ScratchPki) -> None:
    first = pki.identity("seal-m", "seal", model=MODEL)
    keyring = SealKeyring(first.certificate, first.kem_keys)
    second = verify_seal_key_record(
        record(pki, pki.identity("seal-m", "seal", model=MODEL), [], 2), pki.trust()
    )
    older = verify_seal_key_record(
        record(pki, pki.identity("seal-m", "seal", model=MODEL), [], 1), pki.trust()
    )
    assert keyring.is_newer(second)
    keyring.adopt(second, None, now=NOW, keep_s=KEEP_S)
    assert not keyring.is_newer(second)  # the same record again: nothing to do, nothing to count
    with pytest.raises(AuthenticationError) as info:
        keyring.is_newer(older)
    assert info.value.reason == "replayed"


def test_the_replaced_key_opens_until_its_window_passes_then_is_dropped(pki: ScratchPki) -> None:
    first, second = (pki.identity("seal-m", "seal", model=MODEL) for _ in range(2))
    shard = pki.identity("a")
    keyring = SealKeyring(first.certificate, first.kem_keys)
    body = verify_seal_key_record(record(pki, second, [shard], 1), pki.trust())
    keyring.adopt(body, open_seal_key_copy(body, shard), now=NOW, keep_s=KEEP_S)
    old_serial, new_serial = first.body.serial, second.body.serial
    assert keyring.certificate == second.certificate
    assert keyring.key_for(old_serial, NOW + KEEP_S) is not None
    assert keyring.key_for(old_serial, NOW + KEEP_S + 1) is None
    assert keyring.previous is None  # dropped, not just hidden
    assert keyring.key_for(old_serial, NOW) is None
    assert keyring.key_for(new_serial, NOW + 10 * KEEP_S) is not None


def test_rotating_on_disk_leaves_the_revoked_shard_out(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    init_pki(pki)
    kept = issue_node(pki, "kept", "shard", models=(MODEL,))
    gone = issue_node(pki, "gone", "shard", models=(MODEL,))
    gateway = issue_node(pki, "gw", "gateway", models=(MODEL,))
    issue_node(pki, "other", "shard", models=("other",))
    gone_serial = load_bundle(gone, role="shard").identity.body.serial
    old_cert = (gone / "seal" / f"{MODEL}.cert").read_bytes()
    assert models_held_by(pki, [gone_serial]) == [MODEL]
    assert models_held_by(pki, [load_bundle(gateway, role="gateway").identity.body.serial]) == []
    assert models_held_by(pki, [12345]) == sorted([MODEL, "other"])  # unknown serial: every model
    revoke(pki, [gone_serial])

    rotated = rotate_seal_key(pki, MODEL, number=seal_record_number(pki, MODEL) + 1, kem=CryptographyKem())
    body = security_pb2.SealKeyRecordBody.FromString(rotated.body)
    kept_bundle = load_bundle(kept, role="shard")
    assert body.number == seal_record_number(pki, MODEL) == 1
    assert [c.recipient_serial for c in body.copies] == [kept_bundle.identity.body.serial]
    assert kept_bundle.seal_cert_for(MODEL) == body.certificate  # the kept bundles hold the new key
    assert load_bundle(gateway, role="gateway").seal_cert_for(MODEL) == body.certificate
    assert (gone / "seal" / f"{MODEL}.cert").read_bytes() == old_cert  # the revoked one is left as it was
    assert (pki / "seal" / f"{MODEL}.cert").read_bytes() == body.certificate.SerializeToString(
        deterministic=True
    )
    fresh = load_bundle(issue_node(pki, "new", "shard", models=(MODEL,)), role="shard")
    assert fresh.seal_cert_for(MODEL) == body.certificate  # bundles issued from now on get it
