"""Feeding `ClusterState` from the bus: heartbeats, step and request reports, the plan and leader keys.

One NATS connection, three subscriptions and two key watches; a record that does not parse is
dropped with a warning (the service never trusts a sender to be well-formed), and a second-long
tick appends the charts' series. Given the operator root (`trust`), plans, heartbeats and step and
request reports count only when their signatures verify, as for nodes and gateways
(`control_records.py`, `telemetry_records.py`), and a report only when it is about its signer and
came on its signer's subject: a forged one never reaches the dashboard; what was refused is logged
and counted by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.control_records import RecordVerifier
from mohawk_common.bus.plan_follower import LiveNodes, PlanFollower
from mohawk_common.bus.setup import ensure_buckets
from mohawk_common.bus.telemetry_records import open_report
from mohawk_common.tasks import cancel_and_wait
from mohawk_common.telemetry import REQUESTS, STEP, RequestReport, StepReport
from mohawk_pqc.certificates import TrustStore
from mohawk_pqc.errors import AuthenticationError
from mohawk_telemetry.cluster_state import ClusterState
from mohawk_telemetry.exporter import Exporter

log = structlog.get_logger("mohawk.telemetry")


class BusFollower:
    def __init__(
        self,
        nats_servers: list[str],
        state: ClusterState,
        exporter: Exporter,
        trust: TrustStore | None = None,
    ) -> None:
        self.nats_servers, self.state, self.exporter = nats_servers, state, exporter
        self.nc: Client | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.num_dropped = 0
        self.rejections: Counter[str] = Counter()
        self._verifier = verifier = RecordVerifier(trust)
        self._plans = PlanFollower(None, verifier, self._reject)
        self._heartbeats = LiveNodes(verifier, self._reject)

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(), name="telemetry-bus")]

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()

    async def _run(self) -> None:
        self.nc = nc = await connect(self.nats_servers, name="telemetry")
        await nc.subscribe(names.HEARTBEAT_WILDCARD, cb=self._on_heartbeat)
        await nc.subscribe(f"{names.PREFIX}.tel.{STEP}.*", cb=self._on_step)
        await nc.subscribe(f"{names.PREFIX}.tel.{REQUESTS}.*", cb=self._on_requests)
        buckets = await ensure_buckets(nc.jetstream())
        log.info("telemetry following the bus", nats=",".join(self.nats_servers))
        watches = [
            asyncio.create_task(self._watch(buckets.plan, names.PLAN_KEY, self._on_plan)),
            asyncio.create_task(self._watch(buckets.leader, names.LEADER_KEY, self._on_leader)),
        ]
        try:
            while True:
                await asyncio.sleep(1.0)
                self.state.tick(time.monotonic(), time.time())
        finally:
            await cancel_and_wait(*watches)

    async def _watch(self, kv: KeyValue, key: str, apply: Callable[[bytes, str | None], None]) -> None:
        watcher = await kv.watch(key)
        async for entry in watcher:
            if entry is None:
                continue
            try:
                apply(entry.value or b"", entry.operation)
            except Exception as exc:
                self._drop(key, exc)

    def _on_plan(self, value: bytes, operation: str | None) -> None:
        if value and (plan := self._plans.admit(value)) is not None:
            self.state.plan = plan

    def _on_leader(self, value: bytes, operation: str | None) -> None:
        self.state.leader = value.decode() if value and operation in (None, "PUT") else ""

    async def _on_heartbeat(self, msg: Msg) -> None:
        node = self._heartbeats.observe(msg.data, msg.subject)
        if node is not None:
            self.state.on_heartbeat(node.heartbeat, time.monotonic())

    def _reject(self, exc: AuthenticationError) -> None:
        self.rejections[exc.reason] += 1
        log.warning("control record refused", reason=exc.reason, detail=exc.detail)

    def _opened(self, msg: Msg, kind: str) -> tuple[str, str] | None:
        """(sender, the report's JSON) once it verifies as sent by the node or gateway its subject
        names; None (counted) when it does not."""
        try:
            record = open_report(msg.data, kind, self._verifier)
            if msg.subject != names.telemetry_subject(kind, record.sender):
                raise AuthenticationError("untrusted", f"{record.sender}'s report on {msg.subject}")
        except AuthenticationError as exc:
            self._reject(exc)
            return None
        return record.sender, record.body

    async def _on_step(self, msg: Msg) -> None:
        opened = self._opened(msg, STEP)
        if opened is None:
            return
        sender, body = opened
        try:
            report = StepReport.model_validate_json(body)
        except Exception as exc:
            self._drop(msg.subject, exc)
            return
        if report.node_id != sender:
            self._reject(AuthenticationError("untrusted", f"{sender} reported for {report.node_id!r}"))
            return
        self.state.on_step_report(report, time.monotonic())

    async def _on_requests(self, msg: Msg) -> None:
        opened = self._opened(msg, REQUESTS)
        if opened is None:
            return
        sender, body = opened
        try:
            report = RequestReport.model_validate_json(body)
        except Exception as exc:
            self._drop(msg.subject, exc)
            return
        if report.gateway.split(".")[0] != sender:  # the gateway's instance: `<its id>.<run>`
            self._reject(AuthenticationError("untrusted", f"{sender} reported for {report.gateway!r}"))
            return
        self.state.on_request_report(report, time.monotonic())
        self.exporter.on_request_report(report)

    def _drop(self, where: str, exc: Exception) -> None:
        self.num_dropped += 1
        log.warning("unreadable record dropped", subject=where, error=str(exc).splitlines()[0][:200])
