"""`give_back_memory_when_idle`: once no request has started or ended for a while and none is in
flight, the gateway collects its cyclic garbage and gives the freed heap back to the OS
(`mohawk_common.memory_trim`)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

import psutil
import structlog

from mohawk_common.memory_trim import IdleTrim, load_malloc_trim

log = structlog.get_logger("mohawk.gateway")

CHECK_EVERY_S = 1.0


async def give_back_memory_when_idle(
    activity: Callable[[], int], busy: Callable[[], bool], idle: IdleTrim | None = None
) -> None:
    """Run until cancelled; `activity()` grows with every request started or ended, `busy()` says
    whether one is in flight."""
    idle = idle or IdleTrim()
    trim = load_malloc_trim()
    process = psutil.Process()
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        if not idle.due(activity(), time.monotonic(), busy=busy()):
            continue
        before, started = process.memory_info().rss, time.perf_counter()
        collected = gc.collect()
        if trim is not None:
            await asyncio.to_thread(trim)
        after = process.memory_info().rss
        log.info(
            "idle: freed memory given back",
            rss_mb=after >> 20,
            given_mb=(before - after) >> 20,
            collected_objects=collected,
            took_ms=round((time.perf_counter() - started) * 1000, 1),
        )
