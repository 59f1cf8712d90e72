"""Token events carry the step's batch size and whether it overran the request's latency budget."""

from __future__ import annotations

from mohawk_proto.v1 import engine_pb2
from mohawk_shard.engine.request_output import RequestOutput
from mohawk_shard.node.tokens import token_event


def test_batch_size_and_budget_missed_travel_on_the_event() -> None:
    event = token_event(RequestOutput("r", 3, 42, "x", 5, 4, batch_size=6, budget_missed=True))
    decoded = engine_pb2.TokenEvent.FromString(event.SerializeToString())
    assert decoded.batch_size == 6 and decoded.budget_missed
    quiet = token_event(RequestOutput("r", 4, 43, "y", 5, 5, batch_size=2))
    assert quiet.batch_size == 2 and not quiet.budget_missed
