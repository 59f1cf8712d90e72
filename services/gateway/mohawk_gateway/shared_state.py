"""The gateway's shared state: what every route and every generation reads, and whether it is ready.

Design. One `Gateway` per process holds the settings, the bus client, the metrics, tenant access,
the prompt codec, the router, the admission counters and the request reporter. A request is
answered only when the gateway is ready (NATS connected, an active plan for this model, the
tokenizer loaded), or while a plan change is under way (requests then wait on the stream); else
`ready_codec` refuses it with 503 and the reason, before anything reaches the bus. Prompts are
tokenized off the event loop, `tokenize_threads` at a time, and only while admission has room
(429 at once otherwise): requests being tokenized count as in flight, so a burst of clients gets
its 429s without waiting behind the tokenizer; the room is checked again when a generation is
submitted (generation.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import anyio
import jinja2

from mohawk_common.telemetry import REQUESTS
from mohawk_common.tenancy import Tenant
from mohawk_gateway.access import Access
from mohawk_gateway.admission import Admission
from mohawk_gateway.bus import BusClient
from mohawk_gateway.config import GatewaySettings
from mohawk_gateway.errors import GatewayError, invalid, too_many_requests, unavailable
from mohawk_gateway.metrics import GatewayMetrics
from mohawk_gateway.request_reports import RequestReporter
from mohawk_gateway.routing import Router
from mohawk_gateway.submission import capped_priority
from mohawk_gateway.tokenizer import PromptCodec
from mohawk_gateway.wait_estimate import WaitEstimate

T = TypeVar("T")


class Gateway:
    """Runtime state shared by every route: settings, the bus, the tokenizer, metrics."""

    def __init__(
        self, settings: GatewaySettings, bus: BusClient, metrics: GatewayMetrics, access: Access
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.metrics = metrics
        self.access = access
        self.served_model = settings.served_model
        self.created = int(time.time())
        self.codec: PromptCodec | None = None
        self.router = Router(settings.routing)
        self.tokenizer_error: str | None = None
        self.admission = Admission(settings.max_in_flight, settings.retry_after_s, settings.burst_hold)
        self.num_started = 0  # requests submitted, and ended: the idle memory collector watches them
        self.num_ended = 0
        self.reports = RequestReporter(bus.instance, lambda data: bus.publish_telemetry(REQUESTS, data))
        self.waits = WaitEstimate()  # when a request arriving now would get its first token
        self.reports.enabled = settings.telemetry
        self._tokenize_limiter: anyio.CapacityLimiter | None = None

    def not_ready_reason(self) -> str | None:
        if self.codec is None:
            return self.tokenizer_error or "the tokenizer is still loading"
        return self.bus.not_ready_reason(self.served_model)

    @property
    def max_model_len(self) -> int | None:
        plan = self.bus.plan
        return plan.max_model_len if plan is not None and plan.max_model_len > 0 else None

    def check_model(self, model: str | None) -> None:
        """404 unless `model` (None = the default) is the one this gateway serves."""
        if model is not None and model != self.served_model:
            raise GatewayError(
                404, f"the model '{model}' does not exist", param="model", code="model_not_found"
            )

    def ready_codec(self, model: str | None = None) -> PromptCodec:
        """The prompt codec for a request naming `model` (404 unless it is this gateway's; None =
        the default), once every part of the pipeline is ready, or while a plan change is under way
        (requests then wait on the stream); else 503 with the reason."""
        self.check_model(model)
        reason = self.not_ready_reason()
        if self.codec is None or (reason is not None and not self.bus.can_queue(self.served_model)):
            raise unavailable(f"not ready: {reason}", self.settings.retry_after_s)
        return self.codec

    def check_wait(self, tenant: Tenant | None, priority: str | None = None) -> None:
        """429 (`ttft_objective`) when a request of `tenant` at `priority` (None: the tenant's) is
        predicted to wait longer for its first token than its objective (`wait_estimate.py`)."""
        objective = tenant.ttft_objective_s if tenant is not None else None
        objective = objective if objective is not None else self.settings.ttft_objective_s
        if objective is None:
            return
        name, weight = (tenant.name, tenant.weight) if tenant is not None else ("", 1.0)
        effective = capped_priority(priority, tenant)
        predicted = self.waits.predict(name, weight, effective)
        if self.waits.admits(predicted, objective):
            self.waits.admit(name, weight, effective, predicted)  # it waits from now, not from submission
            return
        self.metrics.refused_by_wait.inc()
        raise too_many_requests(
            "ttft_objective",
            f"the first token is predicted in {predicted.wait_s:.1f} s ({predicted.ahead} requests ahead), "
            f"over the {objective:g} s objective; retry later",
            retry_after_s=self.waits.refuse(name, predicted, objective),
        )

    async def encode(self, encode: Callable[[T], list[int]], prompt: T, param: str) -> list[int]:
        """Tokenize off the event loop, in a few threads, once there is room for the request (else
        429 at once); 400 naming `param` if it comes out empty."""
        with self.admission.tokenizing():
            token_ids = await anyio.to_thread.run_sync(encode, prompt, limiter=self._limiter())
        self.metrics.prompts_tokenized.inc()
        if not token_ids:
            raise invalid("the prompt is empty after tokenization", param)
        return token_ids

    async def encode_chat(
        self, codec: PromptCodec, messages: Sequence[Mapping[str, str]], param: str
    ) -> list[int]:
        """A chat through the model's chat template and tokenizer (`encode`); 400 naming `param`
        when the template refuses it."""
        try:
            return await self.encode(codec.encode_chat, messages, param)
        except jinja2.TemplateError as exc:
            raise invalid(f"the model's chat template refused the {param}: {exc}", param) from exc

    def _limiter(self) -> anyio.CapacityLimiter:
        """Prompts are tokenized `tokenize_threads` at a time (made on the loop, at first use)."""
        if self._tokenize_limiter is None:
            self._tokenize_limiter = anyio.CapacityLimiter(self.settings.tokenize_threads)
        return self._tokenize_limiter
