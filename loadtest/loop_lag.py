"""The load generator's own event-loop lag: how late a short sleep wakes, sampled through the run.

Design. One process drives every client. When its loop is busy (reading thousands of SSE chunks on
a core it shares with the cluster), every chunk is stamped late and the latencies measure the
generator, not the cluster. `LoopLagProbe` sleeps `PERIOD_S` again and again while the load runs
and keeps how much later than asked each sleep woke; the report gives those lags beside the
latencies, so a run says which side of the socket its time was spent on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType

PERIOD_S = 0.05


class LoopLagProbe:
    """`async with LoopLagProbe() as probe:` samples the running loop's lag until the block ends;
    `probe.lags_s` holds one lag per wake, in seconds."""

    def __init__(self, period_s: float = PERIOD_S) -> None:
        self.period_s = period_s
        self.lags_s: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopLagProbe:
        self._task = asyncio.create_task(self._sample(), name="loop-lag-probe")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _sample(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.period_s)
            self.lags_s.append(max(0.0, time.perf_counter() - asked - self.period_s))
