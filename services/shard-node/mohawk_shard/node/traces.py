"""`StageTraces`: one span per request on each stage, with the hop and step times it saw.

Design. Steps are shared by many requests, so a stage does not trace steps: it keeps one span per
sequence it serves, opened when the sequence first reaches it (as a child of the previous hop's
span, whose `traceparent` came inside the encrypted frame) and ended when the sequence leaves.
While the sequence runs, every step that carries it adds the hop time of the frame that brought
the step here and the step's own time; the span gets their count, median and maximum as
attributes when it ends (`mohawk.hop_ms.*`, `mohawk.step_ms.*`), with the first hop on its own.
A stage other than the last learns that a sequence ended only with a later step's list of freed
sequences, so a span ends at the time of its sequence's last step, not when that news arrives;
spans of sequences that never see their news (a plan change, a stopped node) end at their last
step too, when the stage stops or after `STALE_S` without a step. With tracing off no span is
made and every call returns at once.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from opentelemetry.trace import Span, SpanKind, Tracer

from mohawk_common.tracing import (
    context_from,
    summary_attributes,
    traceparent_of,
    tracer,
    tracing_enabled,
)

Attributes = Mapping[str, str | int | float | bool]
STALE_S = 120.0
_SWEEP_EVERY_S = 30.0


@dataclass(slots=True)
class _Open:
    span: Span
    traceparent: str
    first_hop_ms: float | None
    hop_ms: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    last_step_ns: int = 0
    last_seen: float = 0.0  # time.monotonic() of its last step


class StageTraces:
    """Spans of the sequences one stage serves, by a key of the caller's (request or sequence id)."""

    def __init__(
        self,
        *,
        stage_index: int,
        node_id: str,
        layers: tuple[int, int],
        plan_version: int,
        pipeline: int,
        tracer_: Tracer | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.enabled = tracing_enabled() if enabled is None else enabled
        self._tracer = tracer_ or tracer()
        self._name = f"mohawk.stage {stage_index}"
        self._attributes: dict[str, str | int | float | bool] = {
            "mohawk.stage": stage_index,
            "mohawk.node": node_id,
            "mohawk.layers": f"{layers[0]}-{layers[1]}",
            "mohawk.plan_version": plan_version,
            "mohawk.pipeline": pipeline,
        }
        self._open: dict[Hashable, _Open] = {}
        self._swept = time.monotonic()

    @classmethod
    def off(cls) -> StageTraces:
        """Traces that record nothing (a stage built without them)."""
        return cls(stage_index=0, node_id="", layers=(0, 0), plan_version=0, pipeline=0, enabled=False)

    def __len__(self) -> int:
        return len(self._open)

    def begin(
        self,
        key: Hashable,
        parent: str,
        request_id: str,
        *,
        hop_ms: float | None = None,
        attributes: Attributes | None = None,
    ) -> str:
        """Open the span of `key` (a child of `parent`, a traceparent; a new trace when it is
        empty) and return its own traceparent for the next hop; "" with tracing off."""
        if not self.enabled:
            return ""
        self.end(key)  # a sequence that joins again (a resume) gets a fresh span
        span = self._tracer.start_span(
            self._name,
            context=context_from(parent),
            kind=SpanKind.CONSUMER,
            attributes={**self._attributes, "mohawk.request_id": request_id, **(attributes or {})},
        )
        if hop_ms is not None:
            span.set_attribute("mohawk.hop_ms.first", round(hop_ms, 3))
        opened = _Open(span, traceparent_of(span), hop_ms, last_seen=time.monotonic())
        self._open[key] = opened
        return opened.traceparent

    def traceparent(self, key: Hashable) -> str:
        opened = self._open.get(key)
        return opened.traceparent if opened is not None else ""

    def stepped(self, keys: Iterable[Hashable], hop_ms: float | None, step_ms: float | None) -> None:
        """A step that carried `keys` arrived `hop_ms` after it was sent and took `step_ms` here
        (either may be None: stage 0 learns its steps' time and their results' hop separately)."""
        if not self._open:
            return
        now_ns, now = time.time_ns(), time.monotonic()
        for key in keys:
            opened = self._open.get(key)
            if opened is None:
                continue
            if hop_ms is not None:
                opened.hop_ms.append(hop_ms)
            if step_ms is not None:
                opened.step_ms.append(step_ms)
            opened.last_step_ns, opened.last_seen = now_ns, now
        if now - self._swept > _SWEEP_EVERY_S:
            self._sweep(now)

    def event(self, key: Hashable, name: str, attributes: Attributes) -> None:
        opened = self._open.get(key)
        if opened is not None:
            opened.span.add_event(name, attributes)

    def end(
        self,
        key: Hashable,
        attributes: Attributes | None = None,
        *,
        at_last_step: bool = False,
    ) -> None:
        """End `key`'s span (now, or at its last step's time) with its hop and step figures."""
        opened = self._open.pop(key, None)
        if opened is None:
            return
        span = opened.span
        span.set_attributes(summary_attributes("mohawk.hop_ms", opened.hop_ms))
        span.set_attributes(summary_attributes("mohawk.step_ms", opened.step_ms))
        span.set_attribute("mohawk.steps", len(opened.step_ms))
        if attributes:
            span.set_attributes(attributes)
        span.end(end_time=opened.last_step_ns if at_last_step and opened.last_step_ns else None)

    def end_all(self) -> None:
        for key in list(self._open):
            self.end(key, {"mohawk.ended": "stage stopped"}, at_last_step=True)

    def _sweep(self, now: float) -> None:
        self._swept = now
        for key, opened in list(self._open.items()):
            if now - opened.last_seen > STALE_S:
                self.end(key, {"mohawk.ended": "no step for a while"}, at_last_step=True)
