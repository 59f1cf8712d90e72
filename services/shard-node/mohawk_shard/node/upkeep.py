"""Stage 0's care of the requests it holds, on the bus: keep-alives, resuming the sequences of
overdue steps, and dropping orphans.

Design. While a request runs, its message's ack deadline is extended a few times per ack wait, so
the stream never redelivers a request that is still served. A step whose deadline passed
(`StepsInFlight.overdue`) frees its sequences, and each resumes from the tokens the token stream
holds for it (what the gateway has shown, or will), as after a plan change; after `max_resumes`
expiries in a row without a token (`HeldRequests.expired`) its request ends with a 503 error event
instead. A request whose gateway is gone or whose deadline passed (`HeldRequests.orphans`) is
cancelled and leaves the stream, with a 504 error event when its deadline passed. What each of
those does to a request is decided in `RequestTable`; this module runs it on a timer, reads the
token stream a resume needs, and has the actions carried out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog
from nats.js import JetStreamContext

from mohawk_common.bus.control_records import RecordVerifier
from mohawk_common.bus.security import Security
from mohawk_shard.engine.sequence import Sequence as Seq
from mohawk_shard.node.bus_actions import BusActions
from mohawk_shard.node.gateways import ORPHAN_CHECK_S, GatewayPresence
from mohawk_shard.node.inflight import StepsInFlight, overdue_sequences
from mohawk_shard.node.recovery import read_emitted
from mohawk_shard.node.request_table import RequestTable

_DEADLINE_TICK_S = 0.25
_KEEP_ALIVES_PER_ACK_WAIT = 3  # a held request's +WPI goes out this many times per ack wait


class Upkeep:
    def __init__(
        self,
        *,
        js: JetStreamContext,
        security: Security,
        table: RequestTable,
        bus: BusActions,
        inflight: StepsInFlight,
        ack_wait_s: float,
        wake: Callable[[], None],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.js, self.table, self.bus = js, table, bus
        self.core, self.held, self.inflight = table.core, table.held, inflight
        self.ack_wait_s = ack_wait_s
        self._wake, self._log = wake, log
        self._gateways = GatewayPresence(
            js,
            verifier=RecordVerifier(security.bundle.trust if security.bundle is not None else None),
            reject=lambda exc: security.reject(exc, what="gateway presence"),
        )

    def loops(self) -> list[asyncio.Task[None]]:
        """Start the keep-alive, deadline and orphan loops."""
        loops = (self._keep_alive_loop(), self._deadline_loop(), self._orphan_loop())
        return [asyncio.create_task(loop) for loop in loops]

    async def _keep_alive_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ack_wait_s / _KEEP_ALIVES_PER_ACK_WAIT)
            for delivery in self.held.deliveries():
                with contextlib.suppress(Exception):
                    await delivery.msg.in_progress()

    async def _deadline_loop(self) -> None:
        """Resume the sequences of overdue steps. Every overdue step stops being awaited at once,
        before any resume awaits the bus: a late result that arrives meanwhile then finds nothing
        to take (it is ignored) instead of taking a step whose sequences were not resumed yet. The
        sequences resume concurrently, so a bus that is away (each read of the token stream waits
        out its timeout) delays them all by one timeout, not one each."""
        while True:
            await asyncio.sleep(_DEADLINE_TICK_S)
            overdue = self.inflight.overdue(time.monotonic())
            for step in overdue:
                self._log.warning(
                    "step overdue: its sequences resume",
                    step_id=step.batch.step_id,
                    sequences=len(step.batch.sequences),
                )
            seqs = overdue_sequences(overdue, self.core.sequence)
            if not seqs:
                continue
            outcomes = await asyncio.gather(*(self._resume(seq) for seq in seqs), return_exceptions=True)
            for seq, outcome in zip(seqs, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    self._log.error(
                        "could not resume a request", request_id=seq.request_id, error=repr(outcome)
                    )
            self._wake()

    async def _resume(self, seq: Seq) -> None:
        """Free `seq` everywhere and queue its request again from the tokens the token stream holds
        (what the gateway has shown, or will), or end it with an error after `max_resumes`."""
        resume, actions = self.table.expire(seq)
        if resume is None:
            if actions:
                self._log.error(
                    "request made no progress: failed",
                    request_id=seq.request_id,
                    expiries=self.held.max_resumes,
                )
            await self.bus.carry_out(actions)
            return
        try:
            emitted, ended = await read_emitted(self.js, seq.request_id, resume.delivery.box)
        except Exception as exc:  # the bus is away: resume from what this node applied
            self._log.warning("token stream unreadable: resuming from the applied tokens", error=repr(exc))
            emitted, ended = list(seq.output_token_ids), False
        await self.bus.carry_out(self.table.resume(resume, emitted, ended))
        if not ended and self.core.request(seq.request_id) is not None:
            self._log.info(
                "request resumed after an overdue step", request_id=seq.request_id, emitted=len(emitted)
            )

    async def _orphan_loop(self) -> None:
        """Drop requests nobody waits for: their gateway's presence lapsed, or their deadline passed."""
        while True:
            await asyncio.sleep(ORPHAN_CHECK_S)
            gone = await self._gateways.gone(self.held.gateways(), time.monotonic())
            for request_id, reason, actions in self.table.orphans(gone, time.time()):
                self._log.warning("orphaned request cancelled", request_id=request_id, reason=reason)
                await self.bus.carry_out(actions)
                self._wake()
