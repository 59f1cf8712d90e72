"""Certificates and revocation lists against one root: validity, revocation, forgery, binding."""

from __future__ import annotations

import pytest

from mohawk_pqc.certificates import TrustStore, check_model, fingerprint, issue_certificate, read_body
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import security_pb2
from tests.pqc.helpers import DAY_S, NOW, Clock, ScratchPki, flip


def reason_of(trust: TrustStore, cert: security_pb2.Certificate, **expect: str) -> str:
    with pytest.raises(AuthenticationError) as caught:
        trust.verify(cert, **expect)
    return caught.value.reason


def test_a_valid_certificate_passes(pki: ScratchPki) -> None:
    identity = pki.identity("shard-a", "shard")
    body = pki.trust().verify(identity.certificate, role="shard", node_id="shard-a")
    assert (body.node_id, body.role, body.issuer) == ("shard-a", "shard", pki.root.issuer)
    assert body.mlkem768_public == identity.kem_keys.mlkem_public
    assert pki.trust().verify(identity.certificate, role=("gateway", "shard")).serial == body.serial


@pytest.mark.parametrize(
    ("now", "valid"),
    [
        (NOW - DAY_S, True),  # the first instant of the window
        (NOW + DAY_S, True),  # the last
        (NOW - DAY_S - 1, False),  # not yet valid
        (NOW + DAY_S + 1, False),  # expired
        (NOW + 400 * DAY_S, False),
    ],
    ids=["first-second", "last-second", "not-yet-valid", "just-expired", "long-expired"],
)
def test_validity_window(pki: ScratchPki, clock: Clock, now: float, valid: bool) -> None:
    cert = pki.identity("shard-a").certificate
    clock.now = now
    if valid:
        pki.trust().verify(cert)
    else:
        assert reason_of(pki.trust(), cert) == "expired"


def test_a_revoked_serial_is_refused_after_a_newer_crl(pki: ScratchPki) -> None:
    revoked, kept = pki.identity("shard-a"), pki.identity("shard-b")
    trust = pki.trust()
    trust.verify(revoked.certificate)
    assert trust.update_revocations(pki.crl(2, [read_body(revoked.certificate).serial]))
    assert trust.crl_number == 2
    assert reason_of(trust, revoked.certificate) == "revoked"
    trust.verify(kept.certificate)


def test_an_older_or_equal_crl_is_not_adopted(pki: ScratchPki) -> None:
    """Replaying an older list (or a same-numbered one) cannot un-revoke anyone."""
    identity = pki.identity("shard-a")
    serial = read_body(identity.certificate).serial
    trust = pki.trust()
    assert trust.update_revocations(pki.crl(5, [serial]))
    assert not trust.update_revocations(pki.crl(4, []))
    assert not trust.update_revocations(pki.crl(5, []))
    assert trust.crl_number == 5 and trust.revoked == {serial}
    assert reason_of(trust, identity.certificate) == "revoked"
    assert trust.update_revocations(pki.crl(6, []))  # the root itself may un-revoke, with a newer list
    trust.verify(identity.certificate)


def test_a_crl_signed_by_another_root_raises(pki: ScratchPki, other_pki: ScratchPki) -> None:
    identity = pki.identity("shard-a")
    trust = pki.trust()
    with pytest.raises(AuthenticationError):
        trust.update_revocations(other_pki.crl(9, [read_body(identity.certificate).serial]))
    assert trust.crl_number == 0 and not trust.revoked
    trust.verify(identity.certificate)


def test_a_crl_with_a_tampered_body_raises(pki: ScratchPki) -> None:
    crl = pki.crl(3, [101])
    body = security_pb2.RevocationListBody.FromString(crl.body)
    body.number = 99
    body.serials.append(102)
    forged = security_pb2.RevocationList(body=body.SerializeToString(), signature=crl.signature)
    trust = pki.trust()
    with pytest.raises(AuthenticationError) as caught:
        trust.update_revocations(forged)
    assert caught.value.reason == "tampered"
    assert trust.crl_number == 0


def test_a_certificate_from_another_root_is_refused(pki: ScratchPki, other_pki: ScratchPki) -> None:
    forged = other_pki.identity("shard-a").certificate
    assert reason_of(pki.trust(), forged) in ("untrusted", "tampered")


def test_another_roots_signature_over_our_issuer_is_refused(pki: ScratchPki, other_pki: ScratchPki) -> None:
    """A forger that copies our issuer id into the body still lacks our root's signature."""
    genuine = read_body(pki.identity("shard-a").certificate)
    forged = issue_certificate(other_pki.root_key, genuine)  # sets issuer to the forger's...
    body = read_body(forged)
    body.issuer = pki.root.issuer  # ...so put ours back and keep the forger's signature
    forged = security_pb2.Certificate(
        body=body.SerializeToString(deterministic=True), signature=forged.signature
    )
    assert reason_of(pki.trust(), forged) == "tampered"


@pytest.mark.parametrize(
    ("expect", "reason"),
    [
        ({"role": "gateway"}, "untrusted"),
        ({"role": ("gateway", "coordinator")}, "untrusted"),
        ({"node_id": "shard-b"}, "untrusted"),
        ({"role": "shard", "node_id": "shard-a "}, "untrusted"),
    ],
    ids=["role", "roles", "node-id", "node-id-almost"],
)
def test_role_or_node_mismatch_is_untrusted(pki: ScratchPki, expect: dict[str, object], reason: str) -> None:
    cert = pki.identity("shard-a", "shard").certificate
    assert reason_of(pki.trust(), cert, **expect) == reason  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["node_id", "role", "not_after", "mlkem768_public", "serial"])
def test_a_body_modified_after_signing_is_tampered(pki: ScratchPki, field: str) -> None:
    cert = pki.identity("shard-a", "shard").certificate
    body = read_body(cert)
    changes: dict[str, object] = {
        "node_id": "shard-b",
        "role": "gateway",
        "not_after": body.not_after + 365 * DAY_S,
        "mlkem768_public": flip(body.mlkem768_public),
        "serial": body.serial + 1,
    }
    setattr(body, field, changes[field])
    tampered = security_pb2.Certificate(body=body.SerializeToString(deterministic=True))
    tampered.signature.CopyFrom(cert.signature)
    assert reason_of(pki.trust(), tampered) == "tampered"


def test_a_flipped_bit_anywhere_in_the_body_is_refused(pki: ScratchPki) -> None:
    cert = pki.identity("shard-a").certificate
    for index in range(0, len(cert.body), 97):
        tampered = security_pb2.Certificate(body=flip(cert.body, index))
        tampered.signature.CopyFrom(cert.signature)
        with pytest.raises(AuthenticationError):
            pki.trust().verify(tampered)


def test_a_garbage_body_is_malformed_or_tampered(pki: ScratchPki) -> None:
    cert = security_pb2.Certificate(body=b"\xff\xff\xff")
    assert reason_of(pki.trust(), cert) in ("tampered", "malformed")


def test_fingerprints_tell_certificates_apart(pki: ScratchPki) -> None:
    a, b = pki.identity("shard-a").certificate, pki.identity("shard-a").certificate
    assert fingerprint(a) == fingerprint(a) and fingerprint(a) != fingerprint(b)
    assert len(fingerprint(a)) == 32


def test_a_certificate_bound_to_a_model_serves_only_it(pki: ScratchPki) -> None:
    bound = pki.identity("shard-1", model="model-a").body
    unbound = pki.identity("shard-2").body  # issued before certificates were bound: any model
    check_model(bound, "model-a")
    check_model(bound, "")  # nothing asked
    check_model(unbound, "model-b")
    with pytest.raises(AuthenticationError) as info:
        check_model(bound, "model-b")
    assert info.value.reason == "untrusted"
    assert info.value.detail == "shard-1's certificate is for model 'model-a', not 'model-b'"
