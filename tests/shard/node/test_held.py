"""The requests stage 0 holds, one record each, with its orphan rule and its resume budget, as a
plain table: no bus, no NATS (a message is only carried, never sent)."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from mohawk_shard.node.config import NodeSettings
from mohawk_shard.node.gateways import ORPHAN_CHECK_S
from mohawk_shard.node.held import Delivery, HeldRequests

NOW = 1_000_000.0


def delivery(reply: str = "", gateway: str = "", deadline: float = 0.0) -> Delivery:
    return Delivery(Msg(None, reply=reply), b"key", None, gateway, deadline)  # type: ignore[arg-type]


def test_held_requests_are_held_released_and_listed() -> None:
    held = HeldRequests(max_resumes=3)
    held.hold("r1", delivery("$JS.ACK.1", gateway="g1"))
    held.hold("r2", delivery("", gateway="g2"))
    held.hold("r3", delivery("$JS.ACK.3"))
    assert len(held) == 3
    assert held.ack_subjects(10) == ["$JS.ACK.1", "$JS.ACK.3"]  # a message without a reply is left out
    assert held.ack_subjects(1) == ["$JS.ACK.1"]
    assert held.gateways() == {"g1", "g2"}  # untracked ("") asks nobody
    released = held.release("r1")
    assert released is not None and released.gateway == "g1"
    assert held.release("r1") is None and held.get("r1") is None
    assert len(held.deliveries()) == 2
    held.clear()
    assert len(held) == 0


def test_orphans_are_those_whose_gateway_is_gone_or_whose_deadline_passed_a_check_ago() -> None:
    held = HeldRequests(max_resumes=3)
    held.hold("alive", delivery(gateway="g1", deadline=NOW + 60))
    held.hold("gateway-gone", delivery(gateway="g2"))
    held.hold("just-due", delivery(gateway="g1", deadline=NOW - ORPHAN_CHECK_S / 2))  # not yet
    held.hold("late", delivery(gateway="g1", deadline=NOW - 2 * ORPHAN_CHECK_S))
    held.hold("both", delivery(gateway="g2", deadline=NOW - 2 * ORPHAN_CHECK_S))
    held.hold("untracked", delivery())
    orphans = {o.request_id: o for o in held.orphans({"g2"}, NOW)}
    assert set(orphans) == {"gateway-gone", "late", "both"}
    assert orphans["gateway-gone"].reason == "its gateway is gone" and not orphans["gateway-gone"].late
    assert orphans["late"].reason == "its deadline passed" and orphans["late"].late
    assert orphans["both"].reason == "its gateway is gone" and orphans["both"].late  # a 504 all the same
    assert len(held) == 6  # deciding drops nothing: stage 0 cancels them, and the core lets them go


def test_no_gateway_gone_and_no_deadline_means_no_orphan() -> None:
    held = HeldRequests(max_resumes=3)
    held.hold("r1", delivery(gateway="g1"))
    assert held.orphans(set(), NOW) == []


def expire_until_spent(held: HeldRequests, request_id: str) -> int:
    """Expire `request_id` until the table says stop; how many resumes it got."""
    for resumes in range(100):
        count = held.expired(request_id)
        if count is None:
            return resumes
        held.hold(request_id, delivery(), expiries=count)  # resumed: held again with its count
    raise AssertionError("the budget never ran out")


@pytest.mark.parametrize("max_resumes", [0, 1, 3])
def test_max_resumes_in_a_row_then_the_request_ends(max_resumes: int) -> None:
    held = HeldRequests(max_resumes)
    held.hold("r1", delivery())
    assert expire_until_spent(held, "r1") == max_resumes


def test_a_token_starts_the_count_again_requests_count_apart_and_release_forgets_it() -> None:
    held = HeldRequests(2)
    held.hold("r1", delivery())
    held.hold("r2", delivery())
    for _ in range(2):
        held.hold("r1", delivery(), expiries=held.expired("r1") or 0)
    assert held.expired("r1") is None  # spent
    held.progressed("r1")  # a token came
    assert held.expired("r1") == 1
    assert held.expired("r2") == 1  # another request has its own count
    held.hold("r1", delivery(), expiries=2)
    held.release("r1")  # it ended: its record, count and all, is gone
    assert held.expired("r1") == 1


def test_the_node_setting_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert NodeSettings().max_resumes == 3
    monkeypatch.setenv("MOHAWK_MAX_RESUMES", "5")
    assert NodeSettings().max_resumes == 5
    monkeypatch.setenv("MOHAWK_MAX_RESUMES", "-1")
    with pytest.raises(ValueError, match="max_resumes"):
        NodeSettings()
