"""The one rule of who may open a channel to whom and who may send which frame kind."""

from __future__ import annotations

import pytest

from mohawk_common.bus.positions import KIND_ACTIVATIONS, KIND_FAILED, KIND_RESULT, may_open, may_send


@pytest.mark.parametrize("num_stages", [2, 3, 5])
def test_only_the_next_stage_and_the_last_from_stage_0_may_be_opened(num_stages: int) -> None:
    allowed = {(i, i + 1) for i in range(num_stages - 1)} | {(0, num_stages - 1)}
    for initiator in range(-1, num_stages + 1):
        for responder in range(-1, num_stages + 1):
            assert may_open(initiator, responder, num_stages) == ((initiator, responder) in allowed)


def test_one_stage_opens_no_channel() -> None:
    assert not may_open(0, 0, 1)


@pytest.mark.parametrize("num_stages", [2, 3, 5])
def test_each_kind_is_accepted_only_from_the_stage_that_sends_it(num_stages: int) -> None:
    last = num_stages - 1
    for sender in range(num_stages):
        for receiver in range(num_stages):
            forward = receiver >= 1 and sender == receiver - 1
            assert may_send(KIND_ACTIVATIONS, sender, receiver, num_stages) == forward
            assert may_send(KIND_FAILED, sender, receiver, num_stages) == forward
            assert may_send(KIND_RESULT, sender, receiver, num_stages) == (sender == last and receiver == 0)
            assert not may_send(0, sender, receiver, num_stages)  # an unknown kind, from anyone
            assert not may_send(99, sender, receiver, num_stages)


def test_a_sender_outside_the_pipeline_is_refused() -> None:
    assert not may_send(KIND_ACTIVATIONS, -1, 0, 3)  # a node the plan does not name
    assert not may_send(KIND_RESULT, 3, 0, 3)
