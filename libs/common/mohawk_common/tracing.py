"""OpenTelemetry traces across the pipeline: the exporter's setup and W3C `traceparent` strings.

Design. A request's trace is carried on the bus as a W3C `traceparent` string inside the messages
that are already encrypted and authenticated (the sealed `GenerateRequest`, each sequence's
`SequenceSpec` in the first frame that carries it, and every token event), never in clear NATS
headers, so it cannot be forged or read on the wire. Each hop opens a span that is the child of
the one before: the gateway's request span → stage 0 → stage 1 → … → the last stage → the
gateway's token span. Exporting is OTLP over HTTP and is off unless an endpoint is configured
with OpenTelemetry's own variables (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`
turn it off again). Off, the API's no-op tracer is used: no span is recorded, every
`traceparent_of` is "" and nothing extra travels on the bus. The batch processor exports in the
background; the provider flushes what it holds when the process exits.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACER_NAME = "mohawk"
_PROPAGATOR = TraceContextTextMapPropagator()
_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_enabled = False


def tracing_configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for OTLP trace export."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in _ENDPOINT_VARIABLES)


def setup_tracing(service: str, instance: str = "", environ: Mapping[str, str] = os.environ) -> bool:
    """Install an OTLP-exporting tracer provider for this process when the environment configures
    one; returns whether traces are on. `service` becomes `service.name` (unless
    `OTEL_SERVICE_NAME` says otherwise), `instance` `service.instance.id`."""
    global _enabled
    if _enabled or not tracing_configured(environ):
        return _enabled
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {SERVICE_NAME: environ.get("OTEL_SERVICE_NAME") or service}
    if instance:
        attributes[SERVICE_INSTANCE_ID] = instance
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _enabled = True
    return True


def tracing_enabled() -> bool:
    """Whether this process records spans (a provider other than the API's no-op one is set)."""
    return _enabled or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def tracer() -> Tracer:
    return trace.get_tracer(TRACER_NAME)


def traceparent_of(span: Span) -> str:
    """`span`'s W3C traceparent, or "" when it is not recording (tracing off)."""
    context = span.get_span_context()
    if not context.is_valid:
        return ""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def context_from(traceparent: str) -> Context | None:
    """The parent context a `traceparent` names; None (a new root) when it is empty or malformed."""
    if not traceparent:
        return None
    context = _PROPAGATOR.extract({"traceparent": traceparent})
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def summary_attributes(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """`prefix.p50`, `.max` and `.sum` of `values` (ms, rounded to µs) for a span; {} when empty."""
    if not values:
        return {}
    array = np.asarray(values)
    return {
        f"{prefix}.p50": round(float(np.median(array)), 3),
        f"{prefix}.max": round(float(array.max()), 3),
        f"{prefix}.sum": round(float(array.sum()), 3),
    }
