"""What stage 0 reads of a request's fair share, and what the sampler learns of its latency budget."""

from __future__ import annotations

import pytest

from mohawk_common.errors import InvalidRequestError
from mohawk_proto.v1 import bus_pb2, engine_pb2
from mohawk_shard.engine.kv_mirror import MirrorSpan
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.sequence import Priority, QoS
from mohawk_shard.engine.stage import SequenceSpec, SequenceStep, StepBatch
from mohawk_shard.node.wire import (
    EncodedMirror,
    Joining,
    mirror_spans,
    qos_from_proto,
    step_batch_from_proto,
    step_batch_to_proto,
    take_mirror,
    write_mirror,
)


def test_a_request_without_fair_share_fields_is_the_anonymous_default() -> None:
    assert qos_from_proto(bus_pb2.GenerateRequest(request_id="r")) == QoS()


def test_fair_share_fields_are_read() -> None:
    request = bus_pb2.GenerateRequest(
        tenant="acme", priority=bus_pb2.PRIORITY_HIGH, weight=2.5, latency_budget_ms=40.0
    )
    assert qos_from_proto(request) == QoS("acme", Priority.HIGH, 2.5, 40.0)
    request.priority = bus_pb2.PRIORITY_LOW
    assert qos_from_proto(request).priority is Priority.LOW
    request.priority = 7  # type: ignore[assignment]  # a class a newer gateway knows: normal here
    assert qos_from_proto(request).priority is Priority.NORMAL


def test_bad_fair_share_fields_are_refused() -> None:
    with pytest.raises(InvalidRequestError):
        qos_from_proto(bus_pb2.GenerateRequest(weight=-1.0))
    with pytest.raises(InvalidRequestError):
        qos_from_proto(bus_pb2.GenerateRequest(latency_budget_ms=-5.0))


def test_the_latency_budget_reaches_the_sampling_stage() -> None:
    spec = SequenceSpec(3, SamplingParams.create(), (), 0, 25.0, carry_key="r")  # the request id
    batch = StepBatch(1, (SequenceStep(0, 0, (5, 6, 7), (0,), True, spec),))
    message = step_batch_to_proto(batch, {0: Joining("r", [6, 7], b"")}, with_token_ids=True)
    message.started_at = 1234.5
    decoded = engine_pb2.StepBatch.FromString(message.SerializeToString())
    back, _ = step_batch_from_proto(decoded)
    assert back == batch and decoded.started_at == 1234.5


def test_a_mirror_crosses_one_hop_and_goes_no_further() -> None:
    spans = (MirrorSpan(7, 0, 5), MirrorSpan(9, 12, 1))
    step = engine_pb2.StepBatch(step_id=4)
    write_mirror(step.mirror, EncodedMirror((2, 4), spans, ("float32", [2, 2, 1, 6, 3], b"kv")))
    received = engine_pb2.StepBatch.FromString(step.SerializeToString())
    mirror = take_mirror(received)
    assert mirror is not None and not received.HasField("mirror")  # the frame passed on has none
    assert (mirror.layer_start, mirror.layer_end, mirror.dtype, list(mirror.shape), mirror.data) == (
        2,
        4,
        "float32",
        [2, 2, 1, 6, 3],
        b"kv",
    )
    assert mirror_spans(mirror) == spans
    assert take_mirror(received) is None
