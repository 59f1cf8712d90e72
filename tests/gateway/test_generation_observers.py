"""generation_observers.py without a bus: what a generation's record and metrics make of its events."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from mohawk_gateway.generation_observers import GenerationObservers, TokenRecord
from mohawk_gateway.metrics import GatewayMetrics
from mohawk_gateway.request_reports import RequestReporter
from mohawk_gateway.submission import Submission
from mohawk_proto.v1 import engine_pb2


def _event(**fields: Any) -> engine_pb2.TokenEvent:
    return engine_pb2.TokenEvent(request_id="chatcmpl-1", **fields)


async def _drop(data: bytes) -> None:
    pass


def test_the_record_counts_tokens_and_keeps_every_text() -> None:
    record = TokenRecord(arrived=10.0)
    assert record.ttft_s is None
    assert record.add(_event(token_id=7, text="Hi", batch_size=4, budget_missed=1), at=10.5)
    assert record.add(_event(token_id=8, text="!", batch_size=2), at=10.75)
    # a final event with no token (a stop found in held-back text) adds its text, not a token
    final = _event(finish_reason="stop", usage=engine_pb2.Usage(cached_tokens=16))
    assert not record.add(final, at=11.0)
    assert record.num_tokens == 2
    assert record.token_times == [10.5, 10.75]
    assert record.ttft_s == 0.5
    assert record.batch_sizes == [4, 2]
    assert record.num_budget_missed == 1
    assert record.num_cached_tokens == 16
    assert record.texts == ["Hi", "!", ""]


def test_an_engine_error_is_neither_a_token_nor_text() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    reports = RequestReporter("gw-1", _drop)
    submission = Submission("chatcmpl-1", "chat", [1, 2, 3], engine_pb2.SamplingParams(), "messages")
    observers = GenerationObservers(metrics, reports, "m", submission, arrived=0.0)
    observers.on_event(_event(error="the engine refused it", error_status=400), at=1.0)
    assert observers.record.num_tokens == 0 and observers.record.texts == []
    observers.on_event(_event(token_id=5, text="a"), at=2.0)
    name, labels = "mohawk_gateway_generated_tokens_total", {"endpoint": "chat"}
    generated = metrics.registry.get_sample_value(name, labels)
    assert observers.record.num_tokens == 1 and generated == 1.0
