"""Sealed requests at admission: stale ones (past their deadline, or re-published after the stream's
duplicate window) are refused, and a redelivered request keeps the time it entered the stream."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.requests import check_fresh, new_token_key, open_request, seal_request
from mohawk_common.bus.security import Security
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import DUPLICATE_WINDOW_S, ensure_streams
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle
from mohawk_proto.v1 import bus_pb2

MODEL = "m"
NOW = 1_750_000_000.0


def request(created: float, deadline: float = 0.0, request_id: str = "r1") -> bus_pb2.GenerateRequest:
    return bus_pb2.GenerateRequest(
        request_id=request_id,
        model=MODEL,
        prompt_token_ids=[1, 2, 3],
        token_key=new_token_key(),
        created=created,
        deadline=deadline,
    )


def stale(made: bus_pb2.GenerateRequest, *, stored_at: float, now: float) -> bool:
    try:
        check_fresh(made, stored_at=stored_at, now=now)
    except AuthenticationError as exc:
        assert exc.reason == "stale"
        return True
    return False


@pytest.mark.parametrize(
    ("made_before_stored_s", "refused"),
    [
        (0.0, False),
        (DUPLICATE_WINDOW_S - 1, False),  # the stream's dedupe still covers it
        (DUPLICATE_WINDOW_S + 1, True),  # a re-publication the dedupe no longer catches
        (3600.0, True),
        (-5.0, False),  # the gateway's clock a little ahead of the server's
    ],
)
def test_a_request_stored_later_than_the_duplicate_window_after_it_was_made_is_stale(
    made_before_stored_s: float, refused: bool
) -> None:
    made = request(created=NOW - made_before_stored_s)
    assert stale(made, stored_at=NOW, now=NOW) is refused


def test_a_request_past_its_deadline_is_stale_and_one_without_a_deadline_is_not() -> None:
    assert stale(request(NOW, deadline=NOW + 600), stored_at=NOW, now=NOW + 601)
    assert not stale(request(NOW, deadline=NOW + 600), stored_at=NOW, now=NOW + 599)
    assert not stale(request(NOW), stored_at=NOW, now=NOW + 86400)


def test_a_long_running_request_taken_over_after_a_failure_is_not_stale() -> None:
    """Redelivery keeps the stream's stamp, so a request that ran 5 minutes is resumed, not refused."""
    made = request(NOW, deadline=NOW + 600)
    assert not stale(made, stored_at=NOW + 0.01, now=NOW + 300)


def test_on_the_stream_a_replayed_sealed_request_is_refused_and_a_redelivery_keeps_its_stamp(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A sealed request recorded off the bus and published again past the duplicate window is
    stored anew (the dedupe has forgotten its id) and refused at admission; a fresh request,
    delivered again after a nak, still carries the time it first entered the stream."""
    pki = tmp_path / "pki"
    init_pki(pki)
    issue_node(pki, "gateway", "gateway", models=(MODEL,))
    issue_node(pki, "shard-a", "shard", models=(MODEL,))
    gateway = Security(
        load_bundle(pki / "nodes" / "gateway", role="gateway"), CryptographyKem(), role="gateway"
    )
    shard = Security(load_bundle(pki / "nodes" / "shard-a", role="shard"), CryptographyKem(), role="shard")

    async def scenario() -> None:
        nc = await connect([nats_server.url], name="test", attempts=3)
        try:
            js = nc.jetstream()
            await ensure_streams(js)
            subject = names.request_subject(MODEL)
            now = time.time()
            replayed = request(created=now - DUPLICATE_WINDOW_S - 60, deadline=now + 600, request_id="old")
            fresh = request(created=now, deadline=now + 600, request_id="new")
            for item in (replayed, fresh):
                data, headers = seal_request(item, gateway)
                await js.publish(subject, data, headers=headers)
            pull = await js.pull_subscribe(subject, durable="test")
            await asyncio.sleep(1.2)
            msgs = await pull.fetch(2, timeout=5)
            opened = {m.metadata.sequence.stream: open_request(m.data, m.headers, shard, MODEL) for m in msgs}
            by_id = {opened[m.metadata.sequence.stream].request_id: m for m in msgs}
            old_msg, new_msg = by_id["old"], by_id["new"]
            assert old_msg.metadata.num_delivered == new_msg.metadata.num_delivered == 1

            def check(msg_id: str) -> None:
                msg = by_id[msg_id]
                check_fresh(
                    opened[msg.metadata.sequence.stream],
                    stored_at=msg.metadata.timestamp.timestamp(),
                    now=time.time(),
                )

            with pytest.raises(AuthenticationError) as refused:
                check("old")
            assert refused.value.reason == "stale"
            await old_msg.term()

            stamp = new_msg.metadata.timestamp.timestamp()
            assert abs(stamp - now) < 1.0 and time.time() - stamp >= 1.0  # stored, not delivered, time
            check("new")
            await new_msg.nak()
            (again,) = await pull.fetch(1, timeout=5)
            assert again.metadata.num_delivered == 2
            assert again.metadata.timestamp.timestamp() == stamp  # a redelivery keeps the stamp
            await again.ack()
        finally:
            await nc.close()

    asyncio.run(scenario())


def test_stage_0_refuses_a_request_from_a_gateway_certificate_bound_to_another_model(tmp_path: Path) -> None:
    """A sealing certificate is public, so a gateway of another model can seal to this model's key;
    its certificate names that other model, and stage 0 refuses it before opening anything. A
    gateway certificate naming no model (issued before models were bound) still serves any."""
    pki = tmp_path / "pki"
    init_pki(pki)
    shard = Security(
        load_bundle(issue_node(pki, "shard-a", "shard", models=(MODEL,)), role="shard"),
        CryptographyKem(),
        role="shard",
    )
    bound_here = issue_node(pki, "gw-m", "gateway", models=(MODEL,))
    unbound = issue_node(pki, "gw-any", "gateway", models=(MODEL, "other"))
    bound_elsewhere = issue_node(pki, "gw-other", "gateway", models=("other",))
    shutil.copyfile(bound_here / "seal" / f"{MODEL}.cert", bound_elsewhere / "seal" / f"{MODEL}.cert")

    def open_from(bundle: Path) -> bus_pb2.GenerateRequest:
        gateway = Security(load_bundle(bundle, role="gateway"), CryptographyKem(), role="gateway")
        data, headers = seal_request(request(created=time.time()), gateway)
        return open_request(data, headers, shard, MODEL)

    assert open_from(bound_here).request_id == open_from(unbound).request_id == "r1"
    with pytest.raises(AuthenticationError) as info:
        open_from(bound_elsewhere)
    assert info.value.reason == "untrusted"
    assert info.value.detail == "gw-other's certificate is for model 'other', not 'm'"
