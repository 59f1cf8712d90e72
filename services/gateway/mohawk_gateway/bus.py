"""`BusClient`: the gateway's one NATS connection — the plan it serves, submitting and cancelling.

Connecting runs in the background (one log line per failed attempt), so the HTTP server is up and
answers /health while NATS is away; until the connection, the streams and buckets are there and an
active plan for this model is known, the client reports why it is not ready and requests get 503.
The plan is watched on its KV key and also re-read every `plan_refresh_s`, so a watcher lost in a
NATS restart cannot leave the gateway believing in a stale plan for long.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import APIError, KeyNotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import encode_json
from mohawk_common.bus.control_records import RecordVerifier, sign_record
from mohawk_common.bus.plan_follower import LiveNodes, PlanFollower
from mohawk_common.bus.requests import cancel_tag, seal_request
from mohawk_common.bus.security import Security
from mohawk_common.bus.setup import ensure_buckets, ensure_streams
from mohawk_common.bus.telemetry_records import seal_report
from mohawk_common.bus.token_log import TokenLogReader
from mohawk_common.tasks import cancel_and_wait
from mohawk_gateway.config import GatewaySettings
from mohawk_gateway.errors import GatewayError, too_many_requests, unavailable, unavailable_after
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.seal import EventBox
from mohawk_proto.v1 import bus_pb2

log = structlog.get_logger("mohawk.gateway")

ACTIVE = "active"
_SETUP_RETRY_S = 1.0


class BusClient:
    """Owns the NATS connection; `start()` returns at once, `close()` drains and stops."""

    def __init__(self, settings: GatewaySettings, security: Security) -> None:
        self._settings = settings
        self.security = security
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._task: asyncio.Task[None] | None = None
        self.plan: bus_pb2.Plan | None = None
        bundle = security.bundle
        verifier = RecordVerifier(bundle.trust if bundle is not None else None)
        self._plans = PlanFollower(None, verifier, self._reject_record)  # signed, never a replay
        self.live_nodes = LiveNodes(verifier, self._reject_record)  # whose heartbeats arrive now
        # this process, as requests name it: stage 0 drops the requests of a gateway whose key lapsed;
        # its presence key is under the gateway's id, the only keys its bus user may write
        self.gateway_id = names.subject_token(settings.gateway_id)
        self.instance = names.gateway_presence_key(self.gateway_id, secrets.token_hex(4))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gateway-bus")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            try:
                async with asyncio.timeout(5.0):
                    await nc.drain()
            except Exception as exc:  # closing anyway; a failed drain is only worth a line
                log.warning("nats drain failed", error=str(exc) or type(exc).__name__)

    @property
    def connected(self) -> bool:
        return self._js is not None and self._nc is not None and self._nc.is_connected

    def not_ready_reason(self, model: str) -> str | None:
        """Why requests for `model` cannot be served now, or None when they can."""
        if not self.connected:
            return "not connected to NATS"
        plan = self.plan
        if plan is None:
            return "no placement plan has been published yet"
        if plan.model and names.subject_token(plan.model) != names.subject_token(model):
            return f"the active plan serves model {plan.model!r}, not {model!r}"
        if plan.state != ACTIVE:
            return f"plan version {plan.version} is {plan.state or 'not active'}, not active"
        # a plan read back from an earlier run says active before its nodes are back: ready only
        # once every node of an active pipeline heartbeats as the run the plan placed
        return self.live_nodes.serving_reason(plan, self._settings.node_ttl_s)

    def can_queue(self, model: str) -> bool:
        """Requests for `model` may wait on the durable stream: connected, and a plan for it exists
        that is changing (loading) rather than missing."""
        plan = self.plan
        return (
            self.connected
            and plan is not None
            and (not plan.model or names.subject_token(plan.model) == names.subject_token(model))
        )

    async def subscribe_tokens(
        self, request_id: str, on_message: Callable[[Msg], Awaitable[None]]
    ) -> Subscription:
        """Core-NATS subscription to the request's token events (make it before publishing)."""
        return await self._client().subscribe(names.token_subject(request_id), cb=on_message)

    async def publish_request(self, request: bus_pb2.GenerateRequest, route: int | None = None) -> None:
        """Put the request on the durable REQUESTS stream, for pipeline `route` (None: whichever
        has room first); 429 when the stream is full."""
        js = self._jetstream()
        try:
            # in a thread: ML-DSA signing alone takes ~0.7 ms of CPU and releases the GIL, so a
            # burst of admissions leaves the loop free to answer everyone else meanwhile
            data, headers = await asyncio.to_thread(seal_request, request, self.security)
        except AuthenticationError as exc:
            raise unavailable_after(
                "the request could not be sealed", exc, self._retry, request_id=request.request_id
            ) from exc
        try:
            await js.publish(names.request_subject(request.model, route), data, headers=headers)
        except APIError as exc:
            log.warning("request queue refused a request", request_id=request.request_id, error=str(exc))
            raise too_many_requests(
                "queue_full", "the request queue is full; retry later", retry_after_s=self._retry
            ) from exc
        except nats.errors.MaxPayloadError as exc:
            raise GatewayError(413, "the prompt is too large to send to the model") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise unavailable_after(
                "the request could not be queued", exc, self._retry, request_id=request.request_id
            ) from exc

    async def publish_telemetry(self, kind: str, data: bytes) -> None:
        """A report (its JSON) for the telemetry service (`mohawk_common.telemetry`), signed by this
        gateway's certificate; raises when not connected."""
        bundle = self.security.bundle
        identity = bundle.identity if bundle is not None else None
        sealed = seal_report(kind, self.gateway_id, data.decode(), identity)
        await self._client().publish(names.telemetry_subject(kind, self.gateway_id), sealed)

    async def cancel(self, request_id: str, token_key: bytes = b"") -> None:
        """Tell stage 0 to drop the request and free its KV blocks (best effort, never raises)."""
        nc = self._nc
        if nc is None or nc.is_closed:
            log.warning("cannot cancel: no NATS connection", request_id=request_id)
            return
        try:
            tag = cancel_tag(token_key, request_id) if token_key else b""
            await nc.publish(names.cancel_subject(request_id), tag)
        except nats.errors.Error as exc:
            log.warning("cancel not sent", request_id=request_id, error=str(exc) or type(exc).__name__)

    def token_log(self, request_id: str, box: EventBox | None = None) -> TokenLogReader:
        """A reader of the request's token events kept in the TOKENS stream; each `read_new()`
        returns only what was stored since its last read."""
        return TokenLogReader(self._jetstream(), request_id, box)

    @property
    def _retry(self) -> int:
        return self._settings.retry_after_s

    def _client(self) -> Client:
        if self._nc is None or not self.connected:
            raise unavailable("not connected to NATS", self._retry)
        return self._nc

    def _jetstream(self) -> JetStreamContext:
        self._client()
        if self._js is None:
            raise unavailable("not connected to NATS", self._retry)
        return self._js

    async def _run(self) -> None:
        settings = self._settings
        nc = await connect(
            settings.nats_servers,
            name="mohawk-gateway",
            creds=settings.bus_creds(settings.gateway_id),
            tls_ca=settings.nats_tls_ca,
        )
        self._nc = nc
        js = nc.jetstream(timeout=settings.publish_timeout_s)
        failures = 0
        while True:
            try:
                await ensure_streams(js, settings.bus_limits())
                buckets = await ensure_buckets(js, settings.bus_limits())
                await buckets.gateways.put(self.instance, self._presence())  # before any request
                self._js = js
                failures = 0
                revocations = asyncio.create_task(self.security.follow_revocations(buckets.pki))
                presence = asyncio.create_task(self._keep_present(buckets.gateways))
                heartbeats = await nc.subscribe(names.HEARTBEAT_WILDCARD, cb=self._on_heartbeat)
                try:
                    await self._watch_plan(buckets.plan)
                finally:
                    await cancel_and_wait(revocations, presence)
                    with suppress(nats.errors.Error):
                        await heartbeats.unsubscribe()
            except (nats.errors.Error, TimeoutError) as exc:
                failures += 1
                level = log.warning if failures == 1 else log.debug
                level("bus setup or plan watch failed, retrying", error=str(exc) or type(exc).__name__)
                await asyncio.sleep(_SETUP_RETRY_S)

    def _presence(self) -> bytes:
        """This process's presence record, signed by the gateway's certificate where it has one."""
        record = bus_pb2.GatewayPresence(
            gateway_id=self._settings.gateway_id,
            instance=self.instance,
            pid=os.getpid(),
            at_ms=int(time.time() * 1000),
        )
        bundle = self.security.bundle
        return encode_json(sign_record(record, bundle.identity, "presence") if bundle is not None else record)

    async def _keep_present(self, kv: KeyValue) -> None:
        """Refresh this process's key in the gateways bucket (TTL `gateway_ttl_s`) four times a TTL."""
        interval = self._settings.bus_limits().gateway_ttl_s / 4
        while True:
            try:
                await kv.put(self.instance, self._presence())
            except (nats.errors.Error, TimeoutError) as exc:
                log.debug("presence not refreshed", error=str(exc) or type(exc).__name__)
            await asyncio.sleep(interval)

    async def _watch_plan(self, kv: KeyValue) -> None:
        watcher = await kv.watch(names.PLAN_KEY)
        try:
            while True:
                try:
                    entry = await watcher.updates(timeout=self._settings.plan_refresh_s)
                except nats.errors.TimeoutError:
                    entry = await _read_plan_entry(kv)
                    if entry is None:
                        self._set_plan(None)
                    else:
                        self._admit_plan(entry)
                    continue
                if entry is None:  # "initial values delivered" marker
                    continue
                deleted = entry.operation in (KV_DEL, KV_PURGE) or not entry.value
                if deleted:
                    self._set_plan(None)
                else:
                    self._admit_plan(entry.value or b"")
        finally:
            with suppress(Exception):
                await watcher.stop()

    def _admit_plan(self, data: bytes) -> None:
        plan = self._plans.admit(data)
        if plan is not None:  # else the plan last admitted stays in force
            self._set_plan(plan)

    async def _on_heartbeat(self, msg: Msg) -> None:
        self.live_nodes.observe(msg.data, msg.subject)

    def _reject_record(self, exc: AuthenticationError) -> None:
        self.security.reject(exc, what="control record")

    def _set_plan(self, plan: bus_pb2.Plan | None) -> None:
        old = self.plan
        self.plan = plan
        if plan is None:
            if old is not None:
                log.warning("plan withdrawn")
            return
        if old is None or (old.version, old.state, old.model) != (plan.version, plan.state, plan.model):
            log.info(
                "plan",
                version=plan.version,
                state=plan.state,
                model=plan.model,
                max_model_len=plan.max_model_len,
                stages=len(plan.stages),
            )


async def _read_plan_entry(kv: KeyValue) -> bytes | None:
    """The plan key's bytes, or None when it holds no plan."""
    try:
        entry = await kv.get(names.PLAN_KEY)
    except KeyNotFoundError:
        return None
    return entry.value or None
