"""The load generator's loop-lag probe on a real event loop: a loop blocked for 0.3 s shows it."""

from __future__ import annotations

import asyncio
import time

from loadtest.loop_lag import LoopLagProbe


def test_a_blocked_loop_shows_as_lag_and_an_idle_one_does_not() -> None:
    async def run() -> tuple[list[float], list[float]]:
        async with LoopLagProbe(period_s=0.01) as idle:
            await asyncio.sleep(0.2)
        async with LoopLagProbe(period_s=0.01) as blocked:
            await asyncio.sleep(0.05)
            time.sleep(0.3)  # the generator busy parsing: nothing else runs
            await asyncio.sleep(0.05)
        return idle.lags_s, blocked.lags_s

    idle, blocked = asyncio.run(run())
    assert len(idle) >= 5 and max(idle) < 0.1
    assert max(blocked) >= 0.25
