"""The channel handshake as an attacker sees it: downgrades, tampering, foreign or stale identities."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import pytest

from mohawk_pqc.certificates import TrustStore, read_body
from mohawk_pqc.channel import FrameReceiver, FrameSender
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.handshake import (
    MAX_CLOCK_SKEW_S,
    AcceptPeer,
    ChannelKeys,
    HandshakeInitiator,
    HandshakeResponder,
)
from mohawk_pqc.identity import Identity, KemKeyPair
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.keyschedule import SUITE
from mohawk_pqc.signing import SigningKey
from mohawk_proto.v1 import security_pb2
from tests.pqc.helpers import DAY_S, NOW, Clock, ScratchPki, accept_any, expect_peer, flip

KEM = CryptographyKem()
PLAN_VERSION = 7


@dataclass
class Ends:
    """Both ends of one handshake, and who they are."""

    initiator: HandshakeInitiator
    responder: HandshakeResponder
    a: Identity
    b: Identity


def make_ends(
    pki: ScratchPki,
    *,
    a: Identity | None = None,
    b: Identity | None = None,
    initiator_trust: TrustStore | None = None,
    responder_trust: TrustStore | None = None,
    responder_id: str = "shard-b",
    accept_at_initiator: AcceptPeer | None = None,
    accept_at_responder: AcceptPeer | None = None,
    initiator_clock: Callable[[], float] | None = None,
) -> Ends:
    a = a or pki.identity("shard-a", "shard")
    b = b or pki.identity("shard-b", "shard")
    initiator = HandshakeInitiator(
        a,
        initiator_trust or pki.trust(),
        plan_version=PLAN_VERSION,
        responder_id=responder_id,
        accept_peer=accept_at_initiator or expect_peer("shard-b", "shard"),
        kem=KEM,
        clock=initiator_clock or pki.clock,
    )
    responder = HandshakeResponder(
        b,
        responder_trust or pki.trust(),
        accept_peer=accept_at_responder or expect_peer("shard-a", "shard"),
        kem=KEM,
        clock=pki.clock,
    )
    return Ends(initiator, responder, a, b)


def run(ends: Ends) -> tuple[ChannelKeys, ChannelKeys]:
    finish, initiator_keys = ends.initiator.handle_response(
        ends.responder.respond(ends.initiator.init_message())
    )
    return initiator_keys, ends.responder.finish(finish)


def reason(call: Callable[[], object]) -> str:
    with pytest.raises(AuthenticationError) as caught:
        call()
    return caught.value.reason


def edit_init(ends: Ends, change: Callable[[security_pb2.HandshakeInit], object]) -> bytes:
    init = security_pb2.HandshakeInit.FromString(ends.initiator.init_message())
    change(init)
    return init.SerializeToString()


def edit_response(data: bytes, change: Callable[[security_pb2.HandshakeResponse], object]) -> bytes:
    response = security_pb2.HandshakeResponse.FromString(data)
    change(response)
    return response.SerializeToString()


# --- the happy path ---------------------------------------------------------------------------------


def test_both_sides_derive_matching_keys_and_see_each_other(pki: ScratchPki) -> None:
    ends = make_ends(pki)
    initiator_keys, responder_keys = run(ends)
    assert initiator_keys.channel_id == responder_keys.channel_id == ends.initiator.channel_id
    assert len(initiator_keys.channel_id) == 16
    assert initiator_keys.send_key == responder_keys.receive_key
    assert initiator_keys.receive_key == responder_keys.send_key
    assert initiator_keys.send_key != initiator_keys.receive_key
    assert len(initiator_keys.send_key) == len(initiator_keys.receive_key) == 32
    assert initiator_keys.peer.SerializeToString() == read_body(ends.b.certificate).SerializeToString()
    assert responder_keys.peer.SerializeToString() == read_body(ends.a.certificate).SerializeToString()
    assert initiator_keys.plan_version == responder_keys.plan_version == PLAN_VERSION


def test_the_keys_carry_frames_both_ways(pki: ScratchPki) -> None:
    initiator_keys, responder_keys = run(make_ends(pki))
    for sender_keys, receiver_keys in ((initiator_keys, responder_keys), (responder_keys, initiator_keys)):
        sender, receiver = FrameSender(sender_keys.send_key), FrameReceiver(receiver_keys.receive_key)
        seq, epoch = sender.next_seq()
        assert receiver.decrypt(seq, epoch, b"hdr", sender.encrypt(seq, epoch, b"hdr", b"hi")) == b"hi"


def test_two_handshakes_between_the_same_nodes_get_fresh_keys(pki: ScratchPki) -> None:
    a, b = pki.identity("shard-a"), pki.identity("shard-b")
    first, _ = run(make_ends(pki, a=a, b=b))
    second, _ = run(make_ends(pki, a=a, b=b))
    assert first.channel_id != second.channel_id
    assert {first.send_key, first.receive_key}.isdisjoint({second.send_key, second.receive_key})


# --- downgrades -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        lambda init: init.ClearField("suites"),
        lambda init: (init.ClearField("suites"), init.suites.append("x25519/aes-256-gcm/hkdf-sha256")),
        lambda init: (init.ClearField("suites"), init.suites.append(SUITE.upper())),
        lambda init: init.ClearField("mlkem768_public"),
        lambda init: setattr(init, "mlkem768_public", init.mlkem768_public[:-1]),
        lambda init: setattr(init, "mlkem768_public", init.mlkem768_public[:32]),
    ],
    ids=[
        "no-suites",
        "classical-only",
        "look-alike-suite",
        "no-mlkem-key",
        "mlkem-key-short",
        "mlkem-key-tiny",
    ],
)
def test_the_responder_refuses_an_offer_without_the_hybrid_suite(
    pki: ScratchPki, change: Callable[[security_pb2.HandshakeInit], object]
) -> None:
    ends = make_ends(pki)
    offer = edit_init(ends, change)
    assert reason(lambda: ends.responder.respond(offer)) == "downgrade"


@pytest.mark.parametrize(
    "change",
    [
        lambda r: setattr(r, "suite", "x25519/aes-256-gcm/hkdf-sha256"),
        lambda r: r.ClearField("suite"),
        lambda r: r.ClearField("mlkem768_ciphertext"),
        lambda r: setattr(r, "mlkem768_ciphertext", r.mlkem768_ciphertext[:-1]),
    ],
    ids=["classical-suite", "no-suite", "no-ciphertext", "short-ciphertext"],
)
def test_the_initiator_refuses_a_response_without_the_hybrid_suite(
    pki: ScratchPki, change: Callable[[security_pb2.HandshakeResponse], object]
) -> None:
    ends = make_ends(pki)
    response = edit_response(ends.responder.respond(ends.initiator.init_message()), change)
    assert reason(lambda: ends.initiator.handle_response(response)) == "downgrade"


# --- tampering in flight ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        lambda r: setattr(r.signature, "ecdsa_p256", flip(r.signature.ecdsa_p256)),
        lambda r: setattr(r.signature, "mldsa65", flip(r.signature.mldsa65, 100)),
        lambda r: setattr(r, "x25519_public", flip(r.x25519_public, 3)),
        lambda r: setattr(r, "mlkem768_ciphertext", flip(r.mlkem768_ciphertext, 500)),
    ],
    ids=["ecdsa-signature", "mldsa-signature", "x25519-key", "mlkem-ciphertext"],
)
def test_a_tampered_message_2_is_refused(
    pki: ScratchPki, change: Callable[[security_pb2.HandshakeResponse], object]
) -> None:
    ends = make_ends(pki)
    response = edit_response(ends.responder.respond(ends.initiator.init_message()), change)
    assert reason(lambda: ends.initiator.handle_response(response)) == "tampered"


def test_message_2_with_another_certificate_of_the_same_node_is_refused(pki: ScratchPki) -> None:
    """An attacker holding a second genuine certificate for shard-b, but not shard-b's key."""
    ends = make_ends(pki)
    stolen = pki.identity("shard-b").certificate
    response = edit_response(
        ends.responder.respond(ends.initiator.init_message()), lambda r: r.certificate.CopyFrom(stolen)
    )
    assert reason(lambda: ends.initiator.handle_response(response)) == "tampered"


@pytest.mark.parametrize(
    "change",
    [
        lambda init: setattr(init, "x25519_public", flip(init.x25519_public)),
        # the key's last 32 bytes are its matrix seed: any change there still encodes a valid key
        lambda init: setattr(init, "mlkem768_public", flip(init.mlkem768_public, -1)),
        lambda init: setattr(init, "plan_version", PLAN_VERSION + 1),
    ],
    ids=["x25519-key", "mlkem-key", "plan-version"],
)
def test_a_message_1_altered_in_flight_fails_at_the_initiator(
    pki: ScratchPki, change: Callable[[security_pb2.HandshakeInit], object]
) -> None:
    """Message 1 is not signed on its own, but the responder signs what it received."""
    ends = make_ends(pki)
    altered = edit_init(ends, change)
    response = ends.responder.respond(altered)
    assert reason(lambda: ends.initiator.handle_response(response)) == "tampered"


def test_an_encapsulation_key_failing_the_fips_203_modulus_check_is_refused(pki: ScratchPki) -> None:
    """A coefficient of 0xFFF (above q = 3329) is no ML-KEM key: refused, not a crash."""
    ends = make_ends(pki)
    invalid = edit_init(
        ends, lambda init: setattr(init, "mlkem768_public", b"\xff\x0f" + init.mlkem768_public[2:])
    )
    assert reason(lambda: ends.responder.respond(invalid)) == "malformed"


@pytest.mark.parametrize("half", ["ecdsa_p256", "mldsa65"])
def test_a_tampered_message_3_is_refused(pki: ScratchPki, half: str) -> None:
    ends = make_ends(pki)
    finish_bytes, _ = ends.initiator.handle_response(ends.responder.respond(ends.initiator.init_message()))
    finish = security_pb2.HandshakeFinish.FromString(finish_bytes)
    setattr(finish.signature, half, flip(getattr(finish.signature, half), 20))
    assert reason(lambda: ends.responder.finish(finish.SerializeToString())) == "tampered"


def test_message_3_for_another_channel_is_refused(pki: ScratchPki) -> None:
    ends = make_ends(pki)
    finish_bytes, _ = ends.initiator.handle_response(ends.responder.respond(ends.initiator.init_message()))
    finish = security_pb2.HandshakeFinish.FromString(finish_bytes)
    finish.channel_id = flip(finish.channel_id)
    assert reason(lambda: ends.responder.finish(finish.SerializeToString())) == "unknown_channel"


def test_garbage_is_malformed(pki: ScratchPki) -> None:
    ends = make_ends(pki)
    assert reason(lambda: ends.responder.respond(b"\xff\xff\xff\xff")) == "malformed"
    assert reason(lambda: ends.initiator.handle_response(b"\xff\xff\xff\xff")) == "malformed"


# --- who is at the other end ------------------------------------------------------------------------


def test_an_initiator_certified_by_another_root_is_refused(pki: ScratchPki, other_pki: ScratchPki) -> None:
    ends = make_ends(pki, a=other_pki.identity("shard-a"))
    assert reason(lambda: ends.responder.respond(ends.initiator.init_message())) in ("untrusted", "tampered")


def test_an_initiator_with_an_expired_certificate_is_refused(pki: ScratchPki) -> None:
    stale = pki.identity("shard-a", not_before=NOW - 30 * DAY_S, not_after=NOW - DAY_S)
    ends = make_ends(pki, a=stale)
    assert reason(lambda: ends.responder.respond(ends.initiator.init_message())) == "expired"


def test_an_initiator_with_a_revoked_certificate_is_refused(pki: ScratchPki) -> None:
    a = pki.identity("shard-a")
    trust = pki.trust()
    trust.update_revocations(pki.crl(2, [read_body(a.certificate).serial]))
    ends = make_ends(pki, a=a, responder_trust=trust)
    assert reason(lambda: ends.responder.respond(ends.initiator.init_message())) == "revoked"


@pytest.mark.parametrize("problem", ["foreign", "expired", "revoked"])
def test_a_responder_with_a_bad_certificate_is_refused(
    pki: ScratchPki, other_pki: ScratchPki, problem: str
) -> None:
    trust = pki.trust()
    if problem == "foreign":
        b = other_pki.identity("shard-b")
    elif problem == "expired":
        b = pki.identity("shard-b", not_before=NOW - 30 * DAY_S, not_after=NOW - DAY_S)
    else:
        b = pki.identity("shard-b")
        trust.update_revocations(pki.crl(2, [read_body(b.certificate).serial]))
    ends = make_ends(pki, b=b, initiator_trust=trust)
    response = ends.responder.respond(ends.initiator.init_message())
    expected = ("untrusted", "tampered") if problem == "foreign" else (problem,)
    assert reason(lambda: ends.initiator.handle_response(response)) in expected


def test_an_offer_meant_for_another_responder_is_refused(pki: ScratchPki) -> None:
    ends = make_ends(pki, responder_id="shard-c")
    assert reason(lambda: ends.responder.respond(ends.initiator.init_message())) == "untrusted"


def test_the_responders_accept_peer_decides(pki: ScratchPki) -> None:
    """A genuine certificate, but not the node the plan puts before this stage."""
    ends = make_ends(pki, a=pki.identity("shard-x"))
    assert reason(lambda: ends.responder.respond(ends.initiator.init_message())) == "untrusted"


def test_the_initiators_accept_peer_decides(pki: ScratchPki) -> None:
    def refuse(peer: security_pb2.CertificateBody, init: security_pb2.HandshakeInit) -> None:
        raise AuthenticationError("untrusted", "not in the plan")

    ends = make_ends(pki, accept_at_initiator=refuse)
    response = ends.responder.respond(ends.initiator.init_message())
    assert reason(lambda: ends.initiator.handle_response(response)) == "untrusted"


@dataclass(frozen=True)
class LyingIdentity:
    """A genuinely certified node that answers offers meant for someone else."""

    certificate: security_pb2.Certificate
    signing_key: SigningKey
    kem_keys: KemKeyPair
    node_id: str


def test_a_certified_node_answering_for_another_is_refused_by_the_initiator(pki: ScratchPki) -> None:
    """shard-c holds a valid shard certificate and answers an offer meant for shard-b; the initiator
    must notice it reached the wrong node even when its own `accept_peer` checks nothing."""
    c = pki.identity("shard-c", "shard")
    impostor = LyingIdentity(c.certificate, c.signing_key, c.kem_keys, node_id="shard-b")
    ends = make_ends(pki, accept_at_initiator=accept_any)
    ends.responder = HandshakeResponder(
        cast(Identity, impostor), pki.trust(), accept_peer=accept_any, kem=KEM, clock=pki.clock
    )
    response = ends.responder.respond(ends.initiator.init_message())
    assert reason(lambda: ends.initiator.handle_response(response)) == "untrusted"


# --- replays ----------------------------------------------------------------------------------------


def test_finish_twice_is_refused(pki: ScratchPki) -> None:
    ends = make_ends(pki)
    finish, _ = ends.initiator.handle_response(ends.responder.respond(ends.initiator.init_message()))
    ends.responder.finish(finish)
    with pytest.raises(AuthenticationError):
        ends.responder.finish(finish)


def test_a_bogus_finish_on_the_sniffed_channel_id_does_not_end_the_handshake(pki: ScratchPki) -> None:
    """The channel id travels in the clear: an attacker's finish for it fails, and the pending
    handshake survives, so the initiator's own finish still opens the channel."""
    ends = make_ends(pki)
    finish, initiator_keys = ends.initiator.handle_response(
        ends.responder.respond(ends.initiator.init_message())
    )
    mallory = pki.identity("shard-a", "shard")  # even a certified key of the same node
    bogus = security_pb2.HandshakeFinish(
        channel_id=ends.initiator.channel_id, signature=mallory.signing_key.sign(b"handshake-finish", b"x")
    )
    assert reason(lambda: ends.responder.finish(bogus.SerializeToString())) == "tampered"
    assert reason(lambda: ends.responder.finish(b"\xff\xff")) == "malformed"
    assert ends.responder.finish(finish).receive_key == initiator_keys.send_key
    assert reason(lambda: ends.responder.finish(finish)) == "unknown_channel"  # consumed now


def test_finish_before_an_offer_is_refused(pki: ScratchPki) -> None:
    ends = make_ends(pki)
    assert reason(lambda: ends.responder.finish(b"")) == "unknown_channel"


def test_a_recorded_handshake_replayed_to_a_fresh_responder_opens_no_channel(pki: ScratchPki) -> None:
    """Messages 1 and 3 recorded off the wire: the fresh responder signs a new transcript, so the
    recorded finish does not verify."""
    ends = make_ends(pki)
    offer = ends.initiator.init_message()
    finish, _ = ends.initiator.handle_response(ends.responder.respond(offer))
    ends.responder.finish(finish)
    fresh = HandshakeResponder(
        ends.b, pki.trust(), accept_peer=expect_peer("shard-a", "shard"), kem=KEM, clock=pki.clock
    )
    fresh.respond(offer)  # within the clock skew the offer itself is answered...
    assert reason(lambda: fresh.finish(finish)) == "tampered"  # ...but no channel opens


@pytest.mark.parametrize(
    ("age_s", "accepted"),
    [
        (MAX_CLOCK_SKEW_S - 1, True),
        (MAX_CLOCK_SKEW_S + 1, False),
        (3600.0, False),
        (-(MAX_CLOCK_SKEW_S + 1), False),  # from the future
    ],
    ids=["just-fresh", "just-stale", "an-hour-old", "from-the-future"],
)
def test_an_old_offer_is_refused_as_replayed(pki: ScratchPki, age_s: float, accepted: bool) -> None:
    ends = make_ends(pki, initiator_clock=Clock(NOW - age_s))
    if accepted:
        run(ends)
    else:
        assert reason(lambda: ends.responder.respond(ends.initiator.init_message())) == "replayed"
