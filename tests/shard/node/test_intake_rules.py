"""Which requests stage 0 takes, as plain rules: the routes it drains, and which unopened requests
go back to the stream."""

from __future__ import annotations

from mohawk_shard.node.intake_rules import UNOPENED_REDELIVERIES, Routes, retry_unopened


def test_only_the_draining_stage_0_takes_inactive_routes_with_requests_waiting() -> None:
    routes = Routes(own=2)
    assert routes.active == {2} and not routes.should_drain(5, num_waiting=3)  # not draining yet
    routes.follow({1, 2}, drains=True)
    assert routes.should_drain(5, num_waiting=3)  # pipeline 5 is gone: its requests are taken
    assert not routes.should_drain(5, num_waiting=0)  # nothing waits there
    assert not routes.should_drain(1, num_waiting=3)  # an active pipeline serves its own
    assert not routes.should_drain(None, num_waiting=3)  # the shared consumer is pulled anyway
    routes.follow({1, 2}, drains=False)
    assert not routes.should_drain(5, num_waiting=3)


def test_a_request_sealed_to_a_key_not_adopted_yet_goes_back_a_few_times() -> None:
    assert retry_unopened("untrusted", 1)
    assert retry_unopened("untrusted", UNOPENED_REDELIVERIES - 1)
    assert not retry_unopened("untrusted", UNOPENED_REDELIVERIES)  # then it is refused
    assert not retry_unopened("tampered", 1)  # any other failure is refused at once
