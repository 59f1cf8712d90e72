"""`StageTraces` with the OpenTelemetry SDK's in-memory exporter: each stage's span is the child of
the previous hop's traceparent, carries its hop and step figures, and ends at its last step; with
tracing off nothing is recorded and nothing travels."""

from __future__ import annotations

import itertools
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mohawk_common.tracing import context_from, traceparent_of, tracing_configured
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.stage import SequenceSpec, SequenceStep, StepBatch
from mohawk_shard.node.traces import StageTraces
from mohawk_shard.node.wire import Joining, step_batch_from_proto, step_batch_to_proto


@pytest.fixture
def spans() -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def stage(index: int, tracer: trace.Tracer) -> StageTraces:
    return StageTraces(
        stage_index=index,
        node_id=f"node-{index}",
        layers=(10 * index, 10 * index + 10),
        plan_version=3,
        pipeline=0,
        tracer_=tracer,
        enabled=True,
    )


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in exporter.get_finished_spans()}


def test_three_stages_make_one_connected_trace_with_hop_times(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    root = tracer.start_span("mohawk.gateway chat")
    stage0, stage1, stage2 = stage(0, tracer), stage(1, tracer), stage(2, tracer)

    tp0 = stage0.begin("req-1", traceparent_of(root), "req-1", attributes={"mohawk.queued_ms": 4.0})
    tp1 = stage1.begin(7, tp0, "req-1", hop_ms=2.0)
    stage1.stepped([7, 8], 2.0, 5.0)  # seq 8 is not traced here: ignored
    stage1.stepped([7], 4.0, 3.0)
    last_step_ns = time.time_ns()
    tp2 = stage2.begin(7, tp1, "req-1", hop_ms=1.0)
    stage2.stepped([7], 1.0, 6.0)
    stage2.end(7, {"mohawk.finish_reason": "length"})
    stage0.stepped(["req-1"], None, 9.0)
    stage0.end("req-1", {"mohawk.output_tokens": 2})
    time.sleep(0.01)
    stage1.end(7, at_last_step=True)  # the news of the end came with a later step
    root.end()

    assert all(tp.startswith("00-") for tp in (tp0, tp1, tp2)) and len({tp0, tp1, tp2}) == 3
    found = by_name(exporter)
    assert set(found) == {"mohawk.gateway chat", "mohawk.stage 0", "mohawk.stage 1", "mohawk.stage 2"}
    assert len({span.context.trace_id for span in found.values()}) == 1
    chain = ["mohawk.gateway chat", "mohawk.stage 0", "mohawk.stage 1", "mohawk.stage 2"]
    for parent, child in itertools.pairwise(chain):
        parent_context, parent_span = found[child].parent, found[parent].context
        assert parent_context is not None and parent_span is not None
        assert parent_context.span_id == parent_span.span_id

    s1 = found["mohawk.stage 1"].attributes or {}
    assert s1["mohawk.stage"] == 1 and s1["mohawk.node"] == "node-1" and s1["mohawk.layers"] == "10-20"
    assert s1["mohawk.request_id"] == "req-1"
    assert s1["mohawk.hop_ms.first"] == 2.0
    assert (s1["mohawk.hop_ms.p50"], s1["mohawk.hop_ms.max"], s1["mohawk.hop_ms.sum"]) == (3.0, 4.0, 6.0)
    assert (s1["mohawk.step_ms.p50"], s1["mohawk.steps"]) == (4.0, 2)
    end_time = found["mohawk.stage 1"].end_time
    assert end_time is not None and end_time <= last_step_ns  # ended at its last step, not at the news
    s0 = found["mohawk.stage 0"].attributes or {}
    assert s0["mohawk.queued_ms"] == 4.0 and s0["mohawk.step_ms.p50"] == 9.0 and "mohawk.hop_ms.p50" not in s0
    assert (found["mohawk.stage 2"].attributes or {})["mohawk.finish_reason"] == "length"


def test_end_all_closes_what_is_open_and_a_rejoining_sequence_gets_a_fresh_span(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    traces = stage(1, tracer)
    first = traces.begin(1, "", "req-a")
    second = traces.begin(1, "", "req-a")  # resumed: the first span ends
    traces.begin(2, "", "req-b")
    assert first != second and len(exporter.get_finished_spans()) == 1
    traces.end_all()
    assert len(exporter.get_finished_spans()) == 3 and len(traces) == 0
    ended = [span.attributes or {} for span in exporter.get_finished_spans()[1:]]
    assert all(attributes["mohawk.ended"] == "stage stopped" for attributes in ended)


def test_tracing_off_records_and_sends_nothing(spans: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    _tracer, exporter = spans
    off = StageTraces.off()
    assert off.begin(1, "", "req") == "" and off.traceparent(1) == "" and len(off) == 0
    off.stepped([1], 1.0, 1.0)
    off.end(1)
    assert exporter.get_finished_spans() == ()
    assert traceparent_of(trace.INVALID_SPAN) == ""
    assert context_from("") is None and context_from("not-a-traceparent") is None


def test_tracing_is_configured_only_by_an_otlp_endpoint() -> None:
    assert not tracing_configured({})
    assert not tracing_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": ""})
    assert tracing_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing_configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert not tracing_configured({**endpoint, "OTEL_SDK_DISABLED": "true"})
    assert not tracing_configured({**endpoint, "OTEL_TRACES_EXPORTER": "none"})


def test_the_traceparent_travels_in_the_joining_sequences_spec() -> None:
    spec = SequenceSpec(3, SamplingParams.create(), (), 0, 0.0)
    batch = StepBatch(5, (SequenceStep(9, 0, (1, 2, 3), (0,), True, spec),), ())
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    message = step_batch_to_proto(batch, {9: Joining("req", (2, 3), b"", traceparent)}, with_token_ids=True)
    _, joining = step_batch_from_proto(message)
    assert joining[9] == Joining("req", (2, 3), b"", traceparent)
