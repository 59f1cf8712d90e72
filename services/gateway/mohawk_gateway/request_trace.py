"""`RequestTrace`: the gateway's two spans of one request, the first and last hops of its trace.

The request span opens when the request arrives (the child of the client's own `traceparent`
header, if it sent one: `TraceContextMiddleware` keeps it for the request's task) and its
traceparent goes to stage 0 inside the sealed request. The token span opens when the first token
event arrives, as the child of the last stage's span that the event names, and collects the hop
of every event (the last stage's `sent_at` to the gateway reading it). Both end when the
generation closes (generation_observers.py). With tracing off neither is made and every call
returns at once.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Receive, Scope, Send

from mohawk_common.tracing import (
    context_from,
    summary_attributes,
    traceparent_of,
    tracer,
    tracing_enabled,
)
from mohawk_proto.v1 import engine_pb2

INCOMING_TRACEPARENT: ContextVar[str] = ContextVar("incoming_traceparent", default="")


class TraceContextMiddleware:
    """Keeps an HTTP request's `traceparent` header for the spans made while serving it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope.get("headers", ()):
                if name == b"traceparent":
                    INCOMING_TRACEPARENT.set(value.decode("latin-1"))
                    break
        await self.app(scope, receive, send)


class RequestTrace:
    def __init__(
        self, request_id: str, endpoint: str, model: str, tenant: str, num_prompt_tokens: int
    ) -> None:
        self.enabled = tracing_enabled()
        self._request: Span | None = None
        self._tokens: Span | None = None
        self._hops_ms: list[float] = []
        if not self.enabled:
            return
        self._request = tracer().start_span(
            f"mohawk.gateway {endpoint}",
            context=context_from(INCOMING_TRACEPARENT.get()),
            kind=SpanKind.SERVER,
            attributes={
                "mohawk.request_id": request_id,
                "mohawk.model": model,
                "mohawk.tenant": tenant,
                "mohawk.prompt_tokens": num_prompt_tokens,
            },
        )

    @property
    def traceparent(self) -> str:
        """What stage 0 makes its span the child of ("" with tracing off)."""
        return traceparent_of(self._request) if self._request is not None else ""

    def on_event(self, event: engine_pb2.TokenEvent) -> None:
        if not self.enabled:
            return
        if event.sent_at > 0:
            self._hops_ms.append(max(0.0, time.time() - event.sent_at) * 1000)
        if self._tokens is None and event.traceparent:
            self._tokens = tracer().start_span(
                "mohawk.gateway tokens", context=context_from(event.traceparent), kind=SpanKind.CONSUMER
            )
            if self._hops_ms:
                self._tokens.set_attribute("mohawk.hop_ms.first", round(self._hops_ms[0], 3))

    def end(self, outcome: str, num_tokens: int, ttft_s: float | None) -> None:
        if self._tokens is not None:
            self._tokens.set_attributes(summary_attributes("mohawk.hop_ms", self._hops_ms))
            self._tokens.set_attribute("mohawk.tokens", num_tokens)
            self._tokens.end()
            self._tokens = None
        if self._request is not None:
            self._request.set_attributes({"mohawk.outcome": outcome, "mohawk.output_tokens": num_tokens})
            if ttft_s is not None:
                self._request.set_attribute("mohawk.ttft_ms", round(ttft_s * 1000, 3))
            if outcome != "ok":
                self._request.set_status(Status(StatusCode.ERROR, outcome))
            self._request.end()
            self._request = None
