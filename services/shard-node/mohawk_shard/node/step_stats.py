"""A shard node's step statistics for the telemetry service: compute time, steps, tokens, queue, KV.

Design. Everything the model computes on a node runs on its one compute thread, so that thread's
executor times each task (`TimedExecutor.busy_s`): the busy share of a window is the growth of
that sum over the window's length, whatever role (or two roles, during a handover) submitted the
work. The roles count what they ran (`StepStats`: steps, tokens, sequence-steps, tokens sampled);
`StepWindow` turns those ever-growing counters into the last window's deltas, so a report lost on
the bus loses only its own window. Stage 0 adds its queue (waiting requests, running sequences) and
KV blocks in use; every stage its hop times. Published every heartbeat interval
(`mohawk_common.telemetry.StepReport`), it costs one small JSON message a second per node.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from mohawk_common.telemetry import StepReport
from mohawk_shard.node.snapshot import NodeSnapshot, StepStats

T = TypeVar("T")


class TimedExecutor(ThreadPoolExecutor):
    """A thread pool that sums the time its tasks ran (`busy_s`, seconds since it started); each
    task runs inside `around()` where set (`HostCores.turn`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.busy_s = 0.0
        self.around: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        def timed() -> T:
            started = time.perf_counter()
            try:
                with self.around():
                    return fn(*args, **kwargs)
            finally:
                self.busy_s += time.perf_counter() - started

        return super().submit(timed)


class StepWindow:
    """The deltas of the counters since the last `take`."""

    def __init__(self, now: float) -> None:
        self._at = now
        self._busy = 0.0
        self._stats: StepStats | None = None
        self._seen = StepStats()

    def take(self, now: float, busy_s: float, stats: StepStats | None) -> tuple[float, float, StepStats]:
        """(window seconds, busy seconds, counts) since the last call."""
        window, busy = max(1e-9, now - self._at), max(0.0, busy_s - self._busy)
        if stats is not self._stats:  # a new role counts from zero
            self._stats, self._seen = stats, StepStats()
        current = stats or StepStats()
        delta = StepStats(
            current.steps - self._seen.steps,
            current.tokens - self._seen.tokens,
            current.sequences - self._seen.sequences,
            current.emitted - self._seen.emitted,
        )
        self._at, self._busy = now, busy_s
        self._seen = StepStats(current.steps, current.tokens, current.sequences, current.emitted)
        return window, min(busy, window), delta


def step_report(node: NodeSnapshot, window: StepWindow) -> StepReport:
    """The node's report for the window that ends now."""
    role = node.stage
    seconds, busy, counts = window.take(time.monotonic(), node.busy_s, role.stats if role else None)
    report = StepReport(
        node_id=node.node_id,
        model=node.model,
        runtime=node.runtime,
        device=node.device,
        weights_format=node.weights_format,
        window_s=seconds,
        busy_s=busy,
        steps=counts.steps,
        tokens=counts.tokens,
        sequences=counts.sequences,
        emitted=counts.emitted,
        failed_steps=node.failed_steps,
        expired_steps=node.expired_steps,
        rss_bytes=node.rss_bytes,
        memory_limit_bytes=node.memory_limit_bytes,
        sent_at=time.time(),
    )
    if role is None:
        return report
    report.pipeline, report.epoch, report.stage = role.pipeline, role.epoch, role.stage_index
    report.num_stages, report.start, report.end = role.num_stages, role.start, role.end
    report.hop_ms_p50, report.hop_ms_p99 = role.hops.percentile_ms(0.5), role.hops.percentile_ms(0.99)
    report.kv_blocks_total = role.kv_blocks_total
    if role.queue is not None:
        report.queue_depth, report.running = role.queue.waiting, role.queue.running
        report.kv_blocks_used = role.queue.kv_blocks_used
    return report
