"""The gateway's request reports for the telemetry service: who waited how long for which tokens.

Each request that ends (finished, failed or cancelled) leaves one `RequestSample`: its time to
first token, its inter-token gaps (the first `MAX_GAPS_PER_REQUEST`), its token count, its
outcome and its tenant. Samples gather in memory and go out once a second as one `RequestReport`
on `mohawk.v1.tel.req.<gateway instance>`; a second with no ended request sends nothing. When NATS
is away the report is dropped (telemetry is best effort; the gateway's own /metrics keeps counting).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence

from mohawk_common.telemetry import MAX_GAPS_PER_REQUEST, RequestReport, RequestSample

MAX_PENDING = 10_000  # samples kept while none can be sent (beyond: the oldest go)


class RequestReporter:
    def __init__(
        self, gateway: str, publish: Callable[[bytes], Awaitable[None]], interval_s: float = 1.0
    ) -> None:
        self.gateway, self._publish, self.interval_s = gateway, publish, interval_s
        self.enabled = True  # the `telemetry` setting: off, nothing is kept or sent
        self._pending: list[RequestSample] = []

    def record(
        self, model: str, tenant: str, arrived: float, token_times: Sequence[float], outcome: str
    ) -> None:
        """One ended request; `arrived` and `token_times` on the same clock."""
        if not self.enabled:
            return
        gaps = [b - a for a, b in itertools.pairwise(token_times)][:MAX_GAPS_PER_REQUEST]
        ttft = token_times[0] - arrived if token_times else None
        self._pending.append(
            RequestSample(
                model=model, tenant=tenant, ttft_s=ttft, gaps_s=gaps, tokens=len(token_times), outcome=outcome
            )
        )
        if len(self._pending) > MAX_PENDING:
            del self._pending[: len(self._pending) - MAX_PENDING]

    async def flush(self) -> None:
        if not self._pending:
            return
        report = RequestReport(gateway=self.gateway, requests=self._pending, sent_at=time.time())
        self._pending = []
        with contextlib.suppress(Exception):
            await self._publish(report.model_dump_json().encode())

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush()
