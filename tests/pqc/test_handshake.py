"""The channel handshake as an attacker sees it: downgrades, tampering, foreign or stale identities."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from mohawk_pqc.certificates import TrustStore, read_body
from mohawk_pqc.channel import FrameReceiver, FrameSender
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.handshake import (
    AcceptPeer,
    ChannelKeys,
    HandshakeInitiator,
    HandshakeResponder,
    sign_reply,
    verify_reply,
)
from mohawk_pqc.identity import Identity
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.keyschedule import SUITE, transcript_hash
from mohawk_proto.v1 import security_pb2
from tests.pqc.helpers import ScratchPki, expect_peer, flip

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


def edit_init(
    ends: Ends, change: Callable[[security_pb2.HandshakeInit], object], *, signer: Identity | None = None
) -> bytes:
    """Message 1 changed by `change`; with its certificate and signature replaced by `signer`'s (a
    certified node, to test what the responder checks after the signature), else left signed as
    it was."""
    init = security_pb2.HandshakeInit.FromString(ends.initiator.init_message())
    change(init)
    if signer is not None:
        init.certificate.CopyFrom(signer.certificate)
        init.ClearField("signature")
        digest = transcript_hash(init.SerializeToString(deterministic=True))
        init.signature.CopyFrom(signer.signing_key.sign(b"handshake-init", digest))
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


INIT_CHANGES = pytest.mark.parametrize(
    "change",
    [
        lambda init: setattr(init, "x25519_public", flip(init.x25519_public)),
        # the key's last 32 bytes are its matrix seed: any change there still encodes a valid key
        lambda init: setattr(init, "mlkem768_public", flip(init.mlkem768_public, -1)),
        lambda init: setattr(init, "plan_version", PLAN_VERSION + 1),
    ],
    ids=["x25519-key", "mlkem-key", "plan-version"],
)


@INIT_CHANGES
def test_a_message_1_altered_in_flight_is_refused_by_the_responder(
    pki: ScratchPki, change: Callable[[security_pb2.HandshakeInit], object]
) -> None:
    """Message 1 is signed by the initiator: the responder refuses it altered, before any KEM work."""
    ends = make_ends(pki)
    assert reason(lambda: ends.responder.respond(edit_init(ends, change))) == "tampered"


def test_an_unsigned_message_1_is_refused(pki: ScratchPki) -> None:
    """Certificates are public (every heartbeat carries one): without the key, no offer."""
    ends = make_ends(pki)
    assert reason(lambda: ends.responder.respond(edit_init(ends, lambda m: m.ClearField("signature")))) == (
        "unsigned"
    )


@INIT_CHANGES
def test_a_message_1_altered_and_signed_again_still_fails_at_the_initiator(
    pki: ScratchPki, change: Callable[[security_pb2.HandshakeInit], object]
) -> None:
    """Even re-signed (by the initiator's key, say by a bug), the responder signs what it received."""
    ends = make_ends(pki)
    altered = edit_init(ends, change, signer=pki.identity("shard-a", "shard"))
    response = ends.responder.respond(altered)
    assert reason(lambda: ends.initiator.handle_response(response)) == "tampered"


def test_an_encapsulation_key_failing_the_fips_203_modulus_check_is_refused(pki: ScratchPki) -> None:
    """A coefficient of 0xFFF (above q = 3329) is no ML-KEM key: refused, not a crash."""
    ends = make_ends(pki)
    invalid = edit_init(
        ends,
        lambda init: setattr(init, "mlkem768_public", b"\xff\x0f" + init.mlkem768_public[2:]),
        signer=pki.identity("shard-a", "shard"),
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


# --- replies: only the node asked may answer, or refuse ------------------------------------------


def test_only_the_node_asked_can_refuse_a_handshake(pki: ScratchPki) -> None:
    """Anyone who may subscribe to a node's handshake subject can answer its requests; a reply
    counts only when the node asked signed it, over the request it answers."""
    request, other_request = b"an offer", b"another offer"
    b, c = pki.identity("shard-b", "shard"), pki.identity("shard-c", "shard")
    refusal = sign_reply(b, request, security_pb2.HandshakeReply(refused=True))

    def check(data: bytes, asked: bytes = request) -> security_pb2.HandshakeReply:
        return verify_reply(pki.trust(), asked, data, responder_id="shard-b", role="shard")

    assert check(refusal).refused  # the node's own refusal stands
    assert check(sign_reply(b, request, security_pb2.HandshakeReply(message=b"ok"))).message == b"ok"
    by_another = sign_reply(c, request, security_pb2.HandshakeReply(refused=True))
    assert reason(lambda: check(by_another)) == "untrusted"  # a certified node, not the one asked
    unsigned = security_pb2.HandshakeReply(refused=True).SerializeToString()
    assert reason(lambda: check(unsigned)) == "unsigned"
    flipped = security_pb2.HandshakeReply.FromString(refusal)
    flipped.refused, flipped.message = False, b"ok"
    assert reason(lambda: check(flipped.SerializeToString())) == "tampered"
    assert reason(lambda: check(refusal, asked=other_request)) == "tampered"  # moved to another request
