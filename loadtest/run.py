"""One whole load test against a target: tenants, warm-up, RSS before, the load, RSS after, report.

Design. The order is the measurement's: the warm-up first (its own tenant and clients, closed
when done), a settle, RSS "before"; then the load, each task with a client of its own, while a
thread samples RSS every 0.5 s for the peaks and a task the generator's own loop lag; every client
closed as its task ends (idle keep-alive connections would hold memory in the gateway), a settle,
RSS "after"; the memory check judges "after" against the RSS once a quarter of the requests had
ended (memory.py says why). The run's tenants are removed from Redis at the end, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import structlog

from bench.results_file import write_results
from loadtest.driver import Driver
from loadtest.loop_lag import LoopLagProbe
from loadtest.measure import Recorder
from loadtest.memory import PeakSampler, compare, snapshot
from loadtest.plot import write_png
from loadtest.report import build_report
from loadtest.spec import LoadSpec
from loadtest.target import Target, create_tenants, remove_tenants, warm_up

log = structlog.get_logger("loadtest")

WORKING_SET_FRACTION = 4  # the working set is read once 1 / this of the requests have ended
WORKING_SET_POLL_S = 1.0


async def run_load(spec: LoadSpec, target: Target, *, seed: int = 0) -> dict[str, Any]:
    """Drive `spec` against `target`; the report (see report.py)."""
    warmup = await warm_up(target, spec)
    num_warmup_ok = sum(r.ok for r in warmup.requests)
    log.info("warmed up", ok=num_warmup_ok, requests=len(warmup.requests))
    await asyncio.sleep(spec.settle_s)
    before = snapshot(target.pids)
    keys = await create_tenants(target.redis_url, spec.tenants)
    recorder = Recorder()
    try:
        with PeakSampler(target.pids) as sampler:
            log.info("load started", sessions=spec.num_sessions, chat_clients=spec.num_chat_clients)
            async with LoopLagProbe() as lag, _working_set_marked(recorder, sampler, spec):
                await Driver(spec, target.url, keys, recorder, seed=seed).run()
            log.info("load done", requests=len(recorder.requests), seconds=round(recorder.now(), 1))
            await asyncio.sleep(spec.settle_s)
        after = snapshot(target.pids)
    finally:
        await remove_tenants(target.redis_url, spec.tenants)
    report = build_report(
        spec,
        recorder,
        compare(before, sampler.peak, after, working_set=sampler.working_set),
        target={"url": target.url, "started_here": target.started_here, "pids": dict(target.pids)},
        generator_lags_s=lag.lags_s,
    )
    report["warmup"] = {"requests": len(warmup.requests), "ok": num_warmup_ok}
    return report


@contextlib.asynccontextmanager
async def _working_set_marked(
    recorder: Recorder, sampler: PeakSampler, spec: LoadSpec
) -> AsyncIterator[None]:
    """While the load runs: mark the sampler's working set once a quarter of the generation
    requests the spec sends have ended."""
    total = sum(spec.num_requests_of(t.name) for t in spec.tenants)
    quarter = max(1, total // WORKING_SET_FRACTION)

    async def watch() -> None:
        while sum(r.generates and r.ended_at is not None for r in recorder.requests) < quarter:
            await asyncio.sleep(WORKING_SET_POLL_S)
        sampler.mark_working_set()

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def write_outputs(
    report: dict[str, Any],
    json_path: Path | None,
    png_path: Path | None,
    table: str = "",
    argv: Sequence[str] | None = None,
) -> None:
    """The report as a stamped result file (`bench/results_file.py`: the commit, machine and command
    that printed `table`, refused under bench/results/ from a dirty tree) and its plot."""
    if json_path is not None:
        write_results(json_path, report, table, argv)
    if png_path is not None:
        write_png(report, png_path)
