"""The node registry with a hand-driven clock: joins, timeouts, malformed heartbeats."""

from __future__ import annotations

from mohawk_common.bus import names
from mohawk_common.bus.control import encode_json
from mohawk_coordinator.registry import NodeRegistry
from mohawk_proto.v1 import bus_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def beat(node_id: str, model: str = "m", role: str = "shard") -> bytes:
    return encode_json(bus_pb2.Heartbeat(node_id=node_id, model=model, role=role, seconds_per_layer=1e-3))


def test_a_node_is_live_until_it_misses_the_timeout() -> None:
    clock = Clock()
    registry = NodeRegistry(3.0, clock=clock)
    assert registry.observe(beat("a"), names.heartbeat_subject("a")) is not None
    registry.observe(beat("b", model="other"))
    assert list(registry.live()) == ["a", "b"]
    assert list(registry.live("m")) == ["a"]
    clock.now += 2.0
    registry.observe(beat("a"))
    clock.now += 1.5  # b silent for 3.5 s, a for 1.5 s
    assert registry.expire() == ["b"]
    assert list(registry.live()) == ["a"]
    clock.now += 3.0
    assert registry.live() == {}


def test_malformed_or_mismatched_heartbeats_are_dropped() -> None:
    registry = NodeRegistry(3.0, clock=Clock())
    assert registry.observe(b"not json") is None
    assert registry.observe(beat("a"), names.heartbeat_subject("b")) is None
    assert registry.observe(encode_json(bus_pb2.Heartbeat(node_id="bad id!"))) is None
    assert registry.observe(beat("gw", role="gateway")) is None
    assert registry.live() == {}


def test_unknown_fields_from_newer_nodes_are_ignored() -> None:
    registry = NodeRegistry(3.0, clock=Clock())
    record = registry.observe(b'{"node_id": "a", "model": "m", "future_field": 1}')
    assert record is not None and record.heartbeat.model == "m"


def holding(node_id: str, started_at_ms: int, *acks: str) -> bytes:
    heartbeat = bus_pb2.Heartbeat(node_id=node_id, role="shard", started_at_ms=started_at_ms)
    heartbeat.held_requests.extend(acks)
    return encode_json(heartbeat)


def test_the_requests_a_dead_or_restarted_stage_0_held_are_handed_back_once() -> None:
    clock = Clock()
    registry = NodeRegistry(3.0, clock=clock)
    registry.observe(holding("a", 1, "$JS.ACK.x.1"))
    registry.observe(holding("a", 1, "$JS.ACK.x.1", "$JS.ACK.x.2"))  # the latest list counts
    registry.observe(holding("b", 1, "$JS.ACK.y.1"))
    assert registry.take_handed_back() == []
    registry.observe(holding("b", 2))  # b came back as a new process: its old requests go back
    assert registry.take_handed_back() == ["$JS.ACK.y.1"]
    clock.now += 3.5
    registry.observe(holding("b", 2))
    assert registry.expire() == ["a"]
    assert registry.take_handed_back() == ["$JS.ACK.x.1", "$JS.ACK.x.2"]
    assert registry.take_handed_back() == []
