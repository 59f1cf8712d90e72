"""The request flow every generation endpoint shares: admit, submit on the bus, read tokens, cancel.

A request is admitted only when the gateway is ready (NATS connected, an active plan for this
model, the tokenizer loaded), its prompt fits the plan's context, and fewer than `max_in_flight`
requests run here; otherwise it is refused with 503, 400 or 429 before anything reaches the bus.
Room is checked twice: before tokenizing (requests being tokenized count as in flight, so a burst
of clients gets its 429s without waiting behind the tokenizer) and again at submission.
`Generation.submit` subscribes to the request's token subject first and only then publishes the
request to the durable REQUESTS stream (message id = request id, so a retried publish is stored
once); a stream at its `max_msgs` refuses the publish, which becomes 429 with Retry-After. Token
events come back through a `TokenStream` (ordered, each index once) and every wait is bounded by
the request's deadline. `close` is called exactly once per submitted request, however it ended:
when the request did not finish (client gone, timeout, server shutdown) it publishes the cancel
that makes stage 0 free the request's KV blocks at once. A tenant's request takes a rate lease
(access.py) just before it is published and gives it back in `close`; it carries the tenant's
name, priority and weight (and a latency budget, if its session has one) to stage 0, whose
scheduler shares the pipeline between tenants by weight. With tracing on, a `RequestTrace` makes
the gateway's spans of the request and sends stage 0 the trace context, sealed with the request.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import anyio
import structlog
from nats.aio.subscription import Subscription

from mohawk_common.bus.requests import new_token_key
from mohawk_common.bus.token_log import TokenLogReader
from mohawk_common.telemetry import REQUESTS
from mohawk_common.tenancy import RateDecision, Tenant, completion_cap
from mohawk_gateway.access import Access
from mohawk_gateway.admission import Admission, Slot
from mohawk_gateway.bus import BusClient
from mohawk_gateway.config import GatewaySettings
from mohawk_gateway.errors import GatewayError, invalid, unavailable
from mohawk_gateway.metrics import GatewayMetrics
from mohawk_gateway.request_reports import RequestReporter
from mohawk_gateway.request_trace import RequestTrace
from mohawk_gateway.routing import Router
from mohawk_gateway.tokenizer import PromptCodec
from mohawk_gateway.tokens import TokenStream
from mohawk_pqc.seal import EventBox
from mohawk_proto.v1 import bus_pb2, engine_pb2

log = structlog.get_logger("mohawk.gateway")


@dataclass(frozen=True, slots=True)
class Submission:
    """What a route asks the pipeline for."""

    request_id: str
    endpoint: str  # metrics label: chat | completions
    prompt_token_ids: list[int]
    sampling: engine_pb2.SamplingParams
    prompt_param: str  # the body field that holds the prompt, for error messages
    affinity_key: bytes = b""  # what prefix-affinity routing hashes (routing.py)
    tenant: Tenant | None = None  # None: the anonymous tenant (no limits, weight 1)
    priority: str | None = None  # high | normal | low; None: the tenant's own
    latency_budget_ms: float = 0.0  # target time per output token at stage 0; 0: none
    sticky: bool = False  # route by prefix affinity whatever the gateway's routing (sessions)

    @property
    def charged_tokens(self) -> int:
        """What the request may use at most: its prompt and its completion limit."""
        sampling = self.sampling
        return len(self.prompt_token_ids) + (sampling.max_tokens if sampling.HasField("max_tokens") else 0)


PRIORITIES = {
    "high": bus_pb2.PRIORITY_HIGH,
    "normal": bus_pb2.PRIORITY_NORMAL,
    "low": bus_pb2.PRIORITY_LOW,
}


class Gateway:
    """Runtime state shared by every route: settings, the bus, the tokenizer, metrics."""

    def __init__(
        self, settings: GatewaySettings, bus: BusClient, metrics: GatewayMetrics, access: Access
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.metrics = metrics
        self.access = access
        self.model_name = settings.model_name
        self.created = int(time.time())
        self.codec: PromptCodec | None = None
        self.router = Router(settings.routing)
        self.tokenizer_error: str | None = None
        self.admission = Admission(settings.max_in_flight, settings.retry_after_s)
        self.num_started = 0  # requests submitted, and ended: the idle memory collector watches them
        self.num_ended = 0
        self.reports = RequestReporter(bus.instance, lambda data: bus.publish_telemetry(REQUESTS, data))
        self.reports.enabled = settings.telemetry
        self._tokenize_limiter: anyio.CapacityLimiter | None = None

    @property
    def tokenize_limiter(self) -> anyio.CapacityLimiter:
        """Prompts are tokenized `tokenize_threads` at a time, off the event loop."""
        if self._tokenize_limiter is None:
            self._tokenize_limiter = anyio.CapacityLimiter(self.settings.tokenize_threads)
        return self._tokenize_limiter

    def not_ready_reason(self) -> str | None:
        if self.codec is None:
            return self.tokenizer_error or "the tokenizer is still loading"
        return self.bus.not_ready_reason(self.model_name)

    @property
    def max_model_len(self) -> int | None:
        plan = self.bus.plan
        return plan.max_model_len if plan is not None and plan.max_model_len > 0 else None

    def check_model(self, model: str | None) -> None:
        """404 unless `model` (None = the default) is the one this gateway serves."""
        if model is not None and model != self.model_name:
            raise GatewayError(
                404, f"the model '{model}' does not exist", param="model", code="model_not_found"
            )

    def ready_codec(self) -> PromptCodec:
        """The prompt codec, once every part of the pipeline is ready, or while a plan change is
        under way (requests then wait on the stream); else 503 with the reason."""
        reason = self.not_ready_reason()
        if self.codec is None or (reason is not None and not self.bus.can_queue(self.model_name)):
            raise unavailable(f"not ready: {reason}", self.settings.retry_after_s)
        return self.codec

    async def start(self, submission: Submission) -> Generation:
        """Admit and submit a request; the caller must `close()` the returned generation."""
        self.ready_codec()
        self._check_context(submission)
        slot = self.admission.take_slot()
        try:
            lease = await self.access.admit(submission.tenant, self._charge(submission))
            lease = await self._grant_completion(submission, lease)
        except BaseException:
            slot.release()
            raise
        generation = Generation(self, submission, slot, lease)
        self.num_started += 1
        try:
            await generation.submit()
        except BaseException:
            slot.release()
            await self.access.release(submission.tenant, lease, 0)
            raise
        return generation

    def _charge(self, submission: Submission) -> int:
        """Tokens charged to the tenant up front: prompt + max_tokens; for a request without
        max_tokens, prompt + a floor (`token_estimate`, less when its cap is less), which
        `_grant_completion` then grows to what the tenant's window has left."""
        sampling = submission.sampling
        if sampling.HasField("max_tokens"):
            return submission.charged_tokens
        num_prompt = len(submission.prompt_token_ids)
        cap = self._completion_cap(submission)
        if cap is None:
            return num_prompt + self.settings.token_estimate
        return num_prompt + max(sampling.min_tokens, min(cap, self.settings.token_estimate))

    async def _grant_completion(
        self, submission: Submission, lease: RateDecision | None
    ) -> RateDecision | None:
        """Give a request without max_tokens one: its cap (`completion_cap`: the context, the
        tenant's tpm), and for a tenant with a tpm no more than its window grants now, so what it
        generates stays within the tenant's tokens a minute."""
        sampling, tenant = submission.sampling, submission.tenant
        cap = self._completion_cap(submission)
        if sampling.HasField("max_tokens") or cap is None:
            return lease
        num_prompt = len(submission.prompt_token_ids)
        granted = max(cap, sampling.min_tokens)  # min_tokens must not exceed it
        limiter = self.access.limiter
        if lease is not None and limiter is not None and tenant is not None and tenant.tpm is not None:
            lease = await limiter.extend(tenant, lease, num_prompt + granted)
            granted = max(lease.lease.charged_tokens - num_prompt, sampling.min_tokens)
        sampling.max_tokens = granted
        return lease

    def _completion_cap(self, submission: Submission) -> int | None:
        tenant = submission.tenant
        tpm = tenant.tpm if tenant is not None else None
        return completion_cap(len(submission.prompt_token_ids), self.max_model_len, tpm)

    def _check_context(self, submission: Submission) -> None:
        limit = self.max_model_len
        if limit is None:
            return
        num_prompt = len(submission.prompt_token_ids)
        if num_prompt >= limit:
            raise invalid(
                f"This model's maximum context length is {limit} tokens. However, your prompt has "
                f"{num_prompt} tokens. Please shorten your prompt.",
                param=submission.prompt_param,
                code="context_length_exceeded",
            )
        sampling = submission.sampling
        if sampling.HasField("max_tokens") and num_prompt + sampling.max_tokens > limit:
            raise invalid(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{num_prompt + sampling.max_tokens} tokens ({num_prompt} in the prompt, "
                f"{sampling.max_tokens} for the completion). Please reduce the prompt or max_tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )


class Generation:
    """One submitted request: read `next_event()` until an event has a finish_reason, then `close()`."""

    def __init__(
        self, gateway: Gateway, submission: Submission, slot: Slot, lease: RateDecision | None = None
    ) -> None:
        self.gateway = gateway
        self.submission = submission
        self.slot = slot  # its hold on the gateway's room, given back when it closes
        self.request_id = submission.request_id
        self.lease = lease
        loop = asyncio.get_running_loop()
        self._arrived = loop.time()
        self._deadline = self._arrived + gateway.settings.request_timeout_s
        self.num_tokens = 0
        self.token_times: list[float] = []  # loop time each token arrived (session statistics)
        self.batch_sizes: list[int] = []  # the stage-0 batch each token was computed in
        self.num_cached_tokens = 0
        self.num_budget_missed = 0  # tokens whose step overran the request's latency budget
        self.texts: list[str] = []  # the answer's text, event by event
        self.failed = False  # ended with an engine error
        self.finished = False
        self._closed = True
        self._cancel_reason = "disconnect"
        self._subscription: Subscription | None = None
        metrics = gateway.metrics
        bus = gateway.bus
        self.token_key = new_token_key() if bus.security.secure else b""
        box = EventBox(self.token_key, self.request_id) if self.token_key else None
        request_id, security = self.request_id, bus.security
        # nothing the stream holds refers back to this generation: a cycle would keep every
        # finished request's objects until the cycle collector runs, which an idle gateway never does
        self._stream = TokenStream(
            self.request_id,
            _TokenLogReplay(bus, box),
            gap_wait_s=gateway.settings.token_gap_wait_s,
            idle_probe_s=gateway.settings.token_idle_probe_s,
            on_duplicate=metrics.duplicate_events.inc,
            on_replay=metrics.replays.inc,
            box=box,
            on_reject=lambda exc: security.reject(exc, request_id=request_id, what="token event"),
        )
        self._log = log.bind(request_id=self.request_id)
        tenant = submission.tenant.name if submission.tenant is not None else ""
        self.trace = RequestTrace(
            self.request_id, submission.endpoint, gateway.model_name, tenant, len(submission.prompt_token_ids)
        )

    async def submit(self) -> None:
        bus = self.gateway.bus
        subscription = await bus.subscribe_tokens(self.request_id, self._stream.on_message)
        request = bus_pb2.GenerateRequest(
            request_id=self.request_id,
            model=self.gateway.model_name,
            prompt_token_ids=self.submission.prompt_token_ids,
            sampling=self.submission.sampling,
            created=time.time(),
            token_key=self.token_key,
            gateway=bus.instance,
            deadline=time.time() + max(0.0, self._deadline - asyncio.get_running_loop().time()),
            traceparent=self.trace.traceparent,
        )
        self._describe_tenant(request)
        route = self.gateway.router.route(
            bus.plan, self.submission.affinity_key, sticky=self.submission.sticky
        )
        try:
            await bus.publish_request(request, route)
        except BaseException:
            await _unsubscribe(subscription)
            self.trace.end("not submitted", 0, None)
            raise
        self._subscription = subscription
        self._closed = False
        endpoint = self.submission.endpoint
        self.gateway.metrics.in_flight.labels(endpoint=endpoint).inc()
        self.gateway.metrics.prompt_tokens.labels(endpoint=endpoint).inc(len(request.prompt_token_ids))
        self._log.info("request submitted", num_prompt_tokens=len(request.prompt_token_ids))

    def _describe_tenant(self, request: bus_pb2.GenerateRequest) -> None:
        """Who the request is for, as stage 0's fair-share scheduler reads it."""
        submission = self.submission
        tenant = submission.tenant
        if tenant is not None:
            request.tenant = tenant.name
            request.weight = tenant.weight
        priority = submission.priority or (tenant.priority if tenant is not None else "normal")
        request.priority = PRIORITIES[priority]
        request.latency_budget_ms = submission.latency_budget_ms

    @property
    def arrived(self) -> float:
        """Loop time the request arrived at (`token_times` count from the same clock)."""
        return self._arrived

    @property
    def rate_headers(self) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers of the tenant's lease (none for the anonymous tenant)."""
        return self.lease.headers() if self.lease is not None else {}

    async def next_event(self) -> engine_pb2.TokenEvent:
        """The next token event, in order; raises `GatewayError` for an engine error or the deadline
        (503 when no pipeline became active within `queue_wait_s` of the request's arrival)."""
        queue_deadline = self._arrived + self.gateway.settings.queue_wait_s
        waiting_for_pipeline = self.num_tokens == 0 and queue_deadline < self._deadline
        try:
            if waiting_for_pipeline and self.gateway.not_ready_reason() is not None:
                try:
                    event = await self._stream.next(queue_deadline)
                except TimeoutError:
                    if self.gateway.not_ready_reason() is not None:
                        self._cancel_reason = "no pipeline"
                        wait = self.gateway.settings.queue_wait_s
                        raise unavailable(
                            f"no pipeline became active within {wait:g} s of the request",
                            self.gateway.settings.retry_after_s,
                        ) from None
                    event = await self._stream.next(self._deadline)  # one is active now: wait on
            else:
                event = await self._stream.next(self._deadline)
        except TimeoutError:
            self._cancel_reason = "timeout"
            timeout = self.gateway.settings.request_timeout_s
            raise GatewayError(
                504, f"the request did not finish within {timeout:g} s", code="timeout"
            ) from None
        self.trace.on_event(event)
        if event.error:
            self.finished = self.failed = True
            status = event.error_status if 400 <= event.error_status <= 599 else 500
            raise GatewayError(status, event.error, code="engine_error" if status >= 500 else None)
        if _carries_token(event):
            self._count_token()
            if event.batch_size:
                self.batch_sizes.append(event.batch_size)
            self.num_budget_missed += event.budget_missed
        self.texts.append(event.text)
        if event.HasField("usage"):
            self.num_cached_tokens = event.usage.cached_tokens
        if event.finish_reason:
            self.finished = True
        return event

    async def collect(self) -> list[engine_pb2.TokenEvent]:
        """Every event up to and including the one that finishes the request."""
        events = [await self.next_event()]
        while not events[-1].finish_reason:
            events.append(await self.next_event())
        return events

    async def close(self) -> None:
        """Cancel on the bus unless finished, unsubscribe, account; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if not self.finished:
                await self.gateway.bus.cancel(self.request_id, self.token_key)
                self.gateway.metrics.cancelled.labels(reason=self._cancel_reason).inc()
                self._log.info("request cancelled", reason=self._cancel_reason, num_tokens=self.num_tokens)
            await _unsubscribe(self._subscription)
            used = len(self.submission.prompt_token_ids) + self.num_tokens
            await self.gateway.access.release(self.submission.tenant, self.lease, used)
        self.slot.release()
        self.gateway.num_ended += 1
        metrics = self.gateway.metrics
        metrics.in_flight.labels(endpoint=self.submission.endpoint).dec()
        if self.finished:
            elapsed = asyncio.get_running_loop().time() - self._arrived
            metrics.request_duration.labels(endpoint=self.submission.endpoint).observe(elapsed)
        outcome = ("failed" if self.failed else "ok") if self.finished else self._cancel_reason
        tenant = self.submission.tenant.name if self.submission.tenant is not None else ""
        self.gateway.reports.record(self.gateway.model_name, tenant, self._arrived, self.token_times, outcome)
        ttft_s = self.token_times[0] - self._arrived if self.token_times else None
        self.trace.end(outcome, self.num_tokens, ttft_s)

    def _count_token(self) -> None:
        metrics = self.gateway.metrics
        endpoint = self.submission.endpoint
        arrived_at = asyncio.get_running_loop().time()
        self.token_times.append(arrived_at)
        if self.num_tokens == 0:
            metrics.time_to_first_token.labels(endpoint=endpoint).observe(arrived_at - self._arrived)
        self.num_tokens += 1
        metrics.generated_tokens.labels(endpoint=endpoint).inc()


class _TokenLogReplay:
    """A request's events stored in the TOKENS stream since the last read-back (the reader keeps
    its cursor): what a `TokenStream` reads when live events went missing."""

    def __init__(self, bus: BusClient, box: EventBox | None) -> None:
        self._bus, self._box = bus, box
        self._reader: TokenLogReader | None = None

    async def __call__(self, request_id: str) -> list[engine_pb2.TokenEvent]:
        if self._reader is None:
            self._reader = self._bus.token_log(request_id, self._box)
        return await self._reader.read_new()


def _carries_token(event: engine_pb2.TokenEvent) -> bool:
    """A final event may carry no token (a cancel, a stop found in held-back text)."""
    return not event.finish_reason or bool(event.text) or event.HasField("logprob") or event.token_id != 0


async def _unsubscribe(subscription: Subscription | None) -> None:
    if subscription is None:
        return
    try:
        await subscription.unsubscribe()
    except Exception as exc:  # a closed connection has no subscription left to remove
        log.debug("unsubscribe failed", error=str(exc) or type(exc).__name__)
