"""A generation's lifecycle: admitted, submitted on the bus, read event by event, closed once.

Design. `Generation.start` admits a request and submits it: the gateway must be ready, the
prompt must fit the plan's context (token_budget.py), fewer than `max_in_flight` requests may run
here (a `Slot` of admission.py, else 429), and a tenant's request takes a rate lease (access.py)
just before it is published. `submit` subscribes to the request's token subject first and only
then publishes the request to the durable REQUESTS stream (message id = request id, so a retried
publish is stored once); a stream at its `max_msgs` refuses the publish, which becomes 429 with
Retry-After. The request carries the tenant's name, priority and weight (and a latency budget, if
its session has one) to stage 0, whose scheduler shares the pipeline between tenants by weight,
and with tracing on the trace context, sealed with it. Token events come back through a
`TokenStream` (ordered, each index once) and every wait is bounded by the request's deadline.
`close` is called exactly once per submitted request, however it ended: when the request did not
finish (client gone, timeout, server shutdown) it publishes the cancel that makes stage 0 free the
request's KV blocks at once, then gives back the lease and the slot. What only watches the
request (metrics, spans, reports, its token record) is `GenerationObservers`.
"""

from __future__ import annotations

import asyncio
import time

import anyio
import structlog
from nats.aio.subscription import Subscription

from mohawk_common.bus.requests import new_token_key
from mohawk_common.bus.token_log import TokenLogReader
from mohawk_common.tenancy import RateDecision
from mohawk_gateway.admission import Slot
from mohawk_gateway.bus import BusClient
from mohawk_gateway.errors import GatewayError, unavailable
from mohawk_gateway.generation_observers import GenerationObservers, TokenRecord
from mohawk_gateway.shared_state import Gateway
from mohawk_gateway.submission import Submission
from mohawk_gateway.token_budget import check_context, lease_tokens
from mohawk_gateway.tokens import TokenStream
from mohawk_pqc.seal import EventBox
from mohawk_proto.v1 import bus_pb2, engine_pb2

log = structlog.get_logger("mohawk.gateway")


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
        arrived = asyncio.get_running_loop().time()
        self._deadline = arrived + gateway.settings.request_timeout_s
        self.observers = GenerationObservers(
            gateway.metrics, gateway.reports, gateway.served_model, submission, arrived, gateway.waits
        )
        self.failed = False  # ended with an engine error
        self.finished = False
        self._closed = True
        self._cancel_reason = "disconnect"
        self._subscription: Subscription | None = None
        metrics, bus = gateway.metrics, gateway.bus
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

    @classmethod
    async def start(cls, gateway: Gateway, submission: Submission) -> Generation:
        """Admit and submit a request; the caller must `close()` the returned generation."""
        gateway.ready_codec()
        max_model_len = gateway.max_model_len
        check_context(submission, max_model_len)
        slot = gateway.admission.take_slot()
        try:
            lease = await lease_tokens(
                gateway.access, submission, max_model_len, gateway.settings.token_estimate
            )
        except BaseException:
            slot.release()
            raise
        generation = cls(gateway, submission, slot, lease)
        gateway.num_started += 1
        try:
            await generation._submit()
        except BaseException:
            slot.release()
            gateway.num_ended += 1  # not in flight: the idle collector counts it ended
            await gateway.access.release(submission.tenant, lease, 0)
            raise
        return generation

    async def _submit(self) -> None:
        bus, submission = self.gateway.bus, self.submission
        subscription = await bus.subscribe_tokens(self.request_id, self._stream.on_message)
        request = bus_pb2.GenerateRequest(
            request_id=self.request_id,
            model=self.gateway.served_model,
            prompt_token_ids=submission.prompt_token_ids,
            sampling=submission.sampling,
            created=time.time(),
            token_key=self.token_key,
            gateway=bus.instance,
            deadline=time.time() + max(0.0, self._deadline - asyncio.get_running_loop().time()),
            traceparent=self.observers.trace.traceparent,
        )
        submission.describe_tenant(request)
        route = self.gateway.router.route(bus.plan, submission.affinity_key, sticky=submission.sticky)
        try:
            await bus.publish_request(request, route)
        except BaseException:
            await _unsubscribe(subscription)
            self.observers.not_submitted()
            raise
        self._subscription = subscription
        self._closed = False
        self.observers.submitted(len(request.prompt_token_ids))

    @property
    def record(self) -> TokenRecord:
        """What the request's events said so far: tokens, their times, the text."""
        return self.observers.record

    @property
    def num_tokens(self) -> int:
        return self.observers.record.num_tokens

    @property
    def rate_headers(self) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers of the tenant's lease (none for the anonymous tenant)."""
        return self.lease.headers() if self.lease is not None else {}

    async def next_event(self) -> engine_pb2.TokenEvent:
        """The next token event, in order; raises `GatewayError` for an engine error or the deadline
        (503 when no pipeline became active within `queue_wait_s` of the request's arrival)."""
        event = await self._wait_for_event()
        self.observers.on_event(event, asyncio.get_running_loop().time())
        if event.error:
            self.finished = self.failed = True
            status = event.error_status if 400 <= event.error_status <= 599 else 500
            raise GatewayError(status, event.error, code="engine_error" if status >= 500 else None)
        if event.finish_reason:
            self.finished = True
        return event

    async def _wait_for_event(self) -> engine_pb2.TokenEvent:
        settings = self.gateway.settings
        queue_deadline = self.record.arrived + settings.queue_wait_s
        waiting_for_pipeline = self.num_tokens == 0 and queue_deadline < self._deadline
        try:
            if waiting_for_pipeline and self.gateway.not_ready_reason() is not None:
                try:
                    return await self._stream.next(queue_deadline)
                except TimeoutError:
                    if self.gateway.not_ready_reason() is not None:
                        self._cancel_reason = "no pipeline"
                        raise unavailable(
                            f"no pipeline became active within {settings.queue_wait_s:g} s of the request",
                            settings.retry_after_s,
                        ) from None
                    # one is active now: wait on
            return await self._stream.next(self._deadline)
        except TimeoutError:
            self._cancel_reason = "timeout"
            raise GatewayError(
                504, f"the request did not finish within {settings.request_timeout_s:g} s", code="timeout"
            ) from None

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
                self.observers.cancelled(self._cancel_reason)
            await _unsubscribe(self._subscription)
            used = self.submission.num_prompt_tokens + self.num_tokens
            await self.gateway.access.release(self.submission.tenant, self.lease, used)
        self.slot.release()
        self.gateway.num_ended += 1
        if self.finished:
            outcome = "failed" if self.failed else "ok"
            elapsed_s: float | None = asyncio.get_running_loop().time() - self.record.arrived
        else:
            outcome, elapsed_s = self._cancel_reason, None
        self.observers.closed(outcome, elapsed_s)


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


async def _unsubscribe(subscription: Subscription | None) -> None:
    if subscription is None:
        return
    try:
        await subscription.unsubscribe()
    except Exception as exc:  # a closed connection has no subscription left to remove
        log.debug("unsubscribe failed", error=str(exc) or type(exc).__name__)
