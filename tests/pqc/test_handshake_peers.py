"""The handshake's peers: who is at the other end (roots, expiry, revocation, the addressed
responder, each side's accept rule, a node answering for another) and replays (finish twice or
before an offer, a sniffed channel id, a recorded handshake, an old offer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import pytest

from mohawk_pqc.certificates import read_body
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.handshake import MAX_CLOCK_SKEW_S, HandshakeResponder
from mohawk_pqc.identity import Identity, KemKeyPair
from mohawk_pqc.signing import SigningKey
from mohawk_proto.v1 import security_pb2
from tests.pqc.helpers import DAY_S, NOW, Clock, ScratchPki, accept_any, expect_peer
from tests.pqc.test_handshake import KEM, make_ends, reason, run

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
