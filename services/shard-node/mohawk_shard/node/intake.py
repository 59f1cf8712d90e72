"""Stage 0's intake on the bus: pull requests off the durable stream while the scheduler has room,
open and check each, and queue it in the engine core.

Design. It pulls only while the scheduler has room (`Scheduler.num_admittable`: the free sequence
slots, and once they are all taken a queue of up to `max_waiting` for fair share to choose from):
that is the backpressure, and whatever it does not pull waits, durable, on the stream. It pulls
from its own route's consumer and the model's shared one, and drains the routes of pipelines no
longer active when `Routes` says so. A request is refused at admission when it cannot be opened
(after a few redeliveries if only its key is new: `retry_unopened`), when it is past its deadline
or entered the stream more than the duplicate window after it was made (`check_fresh`, stale), or
when its prompt or sampling is invalid (a 400 error event). A request delivered before is resumed:
its emitted tokens are replayed from the token stream and it continues at the next index; when the
token stream cannot be read (NATS away, a cluster re-forming after a host is lost), its message
goes back to the stream for a moment later, never terminated (a multihost run lost a request so). With
tracing on, each request gets a span from its pull to its end (`StageTraces`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

from mohawk_common.bus import names
from mohawk_common.bus.requests import check_fresh, open_request
from mohawk_common.bus.security import Security
from mohawk_common.errors import InvalidRequestError
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.bus_actions import Ack, BusActions, Fail, Nak, Term
from mohawk_shard.node.held import Delivery
from mohawk_shard.node.intake_rules import UNOPENED_RETRY_S, Routes, retry_unopened
from mohawk_shard.node.recovery import read_emitted
from mohawk_shard.node.request_table import RequestTable
from mohawk_shard.node.tokens import event_box
from mohawk_shard.node.traces import Attributes
from mohawk_shard.node.wire import qos_from_proto, sampling_from_proto

_DRAIN_EVERY_S = 2.0
STREAM_RETRY_S = 1.0  # a resumed request whose tokens could not be read comes back this soon
_PULL_RETRY_S = 0.5
_FULL_WAIT_S = 0.02  # the scheduler has no room: look again this soon
_PULL_WAIT_S = 1.0  # a fetch on the route's own consumer waits this long for work
_DRAIN_PULL_WAIT_S = 0.2  # a fetch on another route's consumer (drained between steps) waits less
# binding a request consumer is tried again for this long: right after a host is lost, a clustered
# JetStream may not answer until it has elected the stream's and the consumer's new leaders (a
# stage 0 re-planned 3 s after a host was unplugged timed out once and never pulled again)
BIND_WAIT_S = 60.0
_BIND_RETRY_S = 0.5


class RequestIntake:
    def __init__(
        self,
        *,
        nc: Client,
        js: JetStreamContext,
        security: Security,
        served_model: str,
        table: RequestTable,
        bus: BusActions,
        routes: Routes,
        max_waiting: int,
        ack_wait_s: float,
        wake: Callable[[], None],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.nc, self.js, self.security, self.served_model = nc, js, security, served_model
        self.table, self.bus, self.routes = table, bus, routes
        self.core, self.traces = table.core, table.traces
        self.max_waiting, self.ack_wait_s = max_waiting, ack_wait_s
        self._wake, self._log = wake, log
        self._pulls: list[JetStreamContext.PullSubscription] = []
        self._opening: set[str] = set()  # request ids between their pull and their admission

    async def subscribe(self) -> None:
        """Bind the consumers of this pipeline's route and of the model's shared requests."""
        self._pulls = [await self._consumer(self.routes.own), await self._consumer(None)]

    def loops(self) -> list[asyncio.Task[None]]:
        """Start pulling (each consumer) and draining inactive routes."""
        pulls = [asyncio.create_task(self._pull_loop(pull)) for pull in self._pulls]
        return [*pulls, asyncio.create_task(self._drain_loop())]

    async def unsubscribe(self) -> None:
        for pull in self._pulls:
            with contextlib.suppress(Exception):
                await pull.unsubscribe()
        self._pulls = []

    def _room(self) -> int:
        return self.core.scheduler.num_admittable(self.max_waiting)

    async def _consumer(self, route: int | None) -> JetStreamContext.PullSubscription:
        """The durable consumer of the model's shared requests (None) or of those routed to `route`,
        tried again while JetStream does not answer (for `BIND_WAIT_S`)."""
        deadline = time.monotonic() + BIND_WAIT_S
        while True:
            try:
                return await self.js.pull_subscribe(
                    names.request_subject(self.served_model, route),
                    durable=names.stage0_consumer(self.served_model, route),
                    stream=names.REQUESTS_STREAM,
                    config=ConsumerConfig(
                        ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait_s, max_ack_pending=-1
                    ),
                )
            except (
                NatsTimeoutError,
                TimeoutError,
                NoRespondersError,
                NoStreamResponseError,
                ServiceUnavailableError,
            ) as exc:
                if time.monotonic() > deadline:
                    raise
                self._log.warning("request consumer not bound yet, retrying", route=route, error=repr(exc))
                await asyncio.sleep(_BIND_RETRY_S)

    async def _pull_loop(self, pull: JetStreamContext.PullSubscription) -> None:
        """Pull while the scheduler has room (the route's loop and the shared one may each take it:
        at most twice the room is admitted, and the surplus waits in the scheduler)."""
        while True:
            room = self._room()
            if room == 0:
                await asyncio.sleep(_FULL_WAIT_S)
                continue
            try:
                msgs = await pull.fetch(room, timeout=_PULL_WAIT_S)
            except (TimeoutError, NatsTimeoutError):
                continue
            except Exception as exc:  # JetStream busy (503 while a cluster re-forms), NATS away
                self._log.warning("pulling requests failed, retrying", error=repr(exc))
                await asyncio.sleep(_PULL_RETRY_S)
                continue
            await self._admit_all(msgs)

    async def _admit_all(self, msgs: list[Msg]) -> None:
        """Admit a pull's requests side by side: a resumed one first reads what it emitted from the
        token stream (a few round trips to JetStream each), and the 16 requests a failover handed
        back, read one after another, held the new stage 0's first step back by ~50 ms."""
        await asyncio.gather(*(self._admit_or_refuse(msg) for msg in msgs))
        self._wake()

    async def _admit_or_refuse(self, msg: Msg) -> None:
        try:
            await self._admit(msg)
        except Exception:
            self._log.exception("request refused: unreadable", subject=msg.subject)
            await self.bus.carry_out([Term(msg)])

    async def _drain_loop(self) -> None:
        """Serve requests routed to pipelines no longer active, while `Routes` says this stage 0 is
        the one to (the lowest active pipeline): none is left waiting on a route nobody pulls."""
        bound: dict[int, JetStreamContext.PullSubscription] = {}
        while True:
            await asyncio.sleep(_DRAIN_EVERY_S)
            if not self.routes.drains:
                continue
            try:
                infos = await self.js.consumers_info(names.REQUESTS_STREAM)
            except Exception:
                continue
            for info in infos:
                route = names.route_of_consumer(self.served_model, info.name)
                waiting = (info.num_pending or 0) + (info.num_ack_pending or 0)
                if route is None or not self.routes.should_drain(route, waiting):
                    continue
                if route not in bound:
                    with contextlib.suppress(Exception):
                        bound[route] = await self.js.pull_subscribe_bind(info.name, names.REQUESTS_STREAM)
                if route in bound:
                    await self._drain(route, bound[route])

    async def _drain(self, route: int, pull: JetStreamContext.PullSubscription) -> None:
        room = self._room()
        if room == 0:
            return
        try:
            msgs = await pull.fetch(room, timeout=_DRAIN_PULL_WAIT_S)
        except (TimeoutError, NatsTimeoutError):
            return
        except Exception as exc:
            self._log.warning("an orphaned route could not be drained", route=route, error=repr(exc))
            return
        self._log.info("requests of an inactive pipeline's route taken", route=route, requests=len(msgs))
        await self._admit_all(msgs)

    async def _admit(self, msg: Msg) -> None:
        """Open and check one request and queue it (`RequestTable.admit`), or settle its message."""
        try:
            request = open_request(msg.data, msg.headers, self.security, self.served_model)
        except AuthenticationError as exc:
            self.security.reject(exc, subject=msg.subject, what="request")
            # its key may reach this node in a moment
            retry = retry_unopened(exc.reason, msg.metadata.num_delivered)
            await self.bus.carry_out([Nak(msg, UNOPENED_RETRY_S) if retry else Term(msg)])
            return
        request_id = request.request_id
        if self.core.request(request_id) is not None or request_id in self._opening:
            return  # redelivered while we still run it (or still read what it emitted)
        self._opening.add(request_id)
        try:
            await self._admit_opened(msg, request)
        finally:
            self._opening.discard(request_id)

    async def _admit_opened(self, msg: Msg, request: bus_pb2.GenerateRequest) -> None:
        request_id = request.request_id
        try:  # a re-publication the stream's dedupe no longer catches, or nobody waits for it
            check_fresh(request, stored_at=msg.metadata.timestamp.timestamp(), now=time.time())
        except AuthenticationError as exc:
            self.security.reject(exc, request_id=request_id, what="request")
            await self.bus.carry_out([Term(msg)])
            return
        box = event_box(request_id, request.token_key)
        try:
            params = sampling_from_proto(request.sampling)
            qos = qos_from_proto(request)
            prompt = self.core.check_prompt(request_id, request.prompt_token_ids)
        except InvalidRequestError as exc:
            await self.bus.carry_out([Fail(msg, request_id, str(exc), 400, box)])
            return
        emitted: list[int] = []
        if msg.metadata.num_delivered > 1:
            try:
                emitted, ended = await read_emitted(self.js, request_id, box)
            except Exception as exc:  # the bus is away (a cluster re-forming): not the request's fault
                self._log.warning(
                    "token stream unreadable: request handed back", request_id=request_id, error=repr(exc)
                )
                await self.bus.carry_out([Nak(msg, STREAM_RETRY_S)])
                return
            if ended:
                await self.bus.carry_out([Ack(msg)])
                return
            self._log.info("request resumed", request_id=request_id, emitted=len(emitted))
        delivery = Delivery(
            msg, request.token_key, box, request.gateway, request.deadline, request.traceparent
        )
        span: Attributes | None = None
        if self.traces.enabled:
            queued_ms = max(0.0, time.time() - request.created) * 1000 if request.created else 0.0
            span = {
                "mohawk.queued_ms": round(queued_ms, 3),
                "mohawk.tenant": request.tenant,
                "mohawk.prompt_tokens": len(prompt),
                "mohawk.resumed_from_token": len(emitted),
                "mohawk.delivery": msg.metadata.num_delivered,
            }
        self.table.admit(delivery, request_id, prompt, params, emitted, qos, span)
