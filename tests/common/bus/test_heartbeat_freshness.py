"""A heartbeat is admitted only above the last one seen from its node, and only near this clock."""

from __future__ import annotations

import pytest

from mohawk_common.bus.heartbeat_freshness import WINDOW_S, HeartbeatFreshness
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1.bus_pb2 import Heartbeat

NOW = 1_800_000_000.0
RUN_1, RUN_2 = 1_700_000_000_000, 1_700_000_100_000


def beat(sequence: int, started: int = RUN_1, sent_at: float = NOW, node: str = "node-a") -> Heartbeat:
    return Heartbeat(node_id=node, started_at_ms=started, sequence=sequence, sent_at=sent_at)


def refused(freshness: HeartbeatFreshness, heartbeat: Heartbeat) -> str:
    with pytest.raises(AuthenticationError) as caught:
        freshness.admit(heartbeat)
    return caught.value.reason


def test_a_heartbeat_not_above_the_last_of_its_node_is_a_replay() -> None:
    freshness = HeartbeatFreshness(clock=lambda: NOW)
    freshness.admit(beat(1))
    freshness.admit(beat(2))
    assert refused(freshness, beat(2)) == "replayed"  # the same one again
    assert refused(freshness, beat(1)) == "replayed"  # an older one
    freshness.admit(beat(5))  # gaps are fine: a heartbeat may be lost
    freshness.admit(beat(1, started=RUN_2))  # the node restarted: its count starts over
    assert refused(freshness, beat(6, started=RUN_1)) == "replayed"  # the earlier incarnation's
    freshness.admit(beat(1, node="node-b"))  # each node on its own
    assert refused(freshness, beat(1, node="node-b")) == "replayed"


def test_a_heartbeat_far_from_this_clock_is_stale_and_leaves_no_trace() -> None:
    freshness = HeartbeatFreshness(clock=lambda: NOW)
    assert refused(freshness, beat(7, sent_at=NOW - WINDOW_S - 1)) == "stale"  # recorded long ago
    assert refused(freshness, beat(7, sent_at=NOW + WINDOW_S + 1)) == "stale"  # dated ahead
    assert refused(freshness, beat(7, sent_at=0.0)) == "stale"  # no time at all
    freshness.admit(beat(1, sent_at=NOW - WINDOW_S + 1))  # the refused ones set no floor
