"""The cluster as the telemetry service sees it, built from what travels on the bus.

Design. Every input is a record some process already publishes: heartbeats (a node's device,
memory, plan version, security rejections), step reports (`mohawk_common.telemetry.StepReport`:
the last window's compute time, steps, tokens, queue and KV), request reports (time to first
token and inter-token gaps, per tenant), the plan and the leader key. `ClusterState` keeps the
latest of each per node, and derives on demand: a stage's busy share (compute seconds over the
window), its bubble share (the rest of the window, while its pipeline had requests running or
waiting: the time the pipeline's other stages kept it waiting), tokens/s per stage (tokens it
processed) and per pipeline (tokens its last stage sampled). Once a second `tick` appends the
cluster's output tokens/s and stage-0 queue depth to a five-minute series, for the charts.
Latency percentiles cover the requests that ended in the last minute. A node whose heartbeats
stopped for `node_ttl_s` is shown down and its stage figures drop out of the sums.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from mohawk_common.bus.pipelines import pipelines
from mohawk_common.bus.setup import NODE_TTL_S
from mohawk_common.telemetry import RequestReport, StepReport
from mohawk_proto.v1 import bus_pb2
from mohawk_telemetry.snapshot import (
    ClusterSnapshot,
    NodeView,
    Percentiles,
    PipelineView,
    PlanView,
    Series,
    StageView,
)

SERIES_POINTS = 300  # five minutes, one a second
LATENCY_WINDOW_S = 60.0


@dataclass
class NodeRecord:
    heartbeat: bus_pb2.Heartbeat | None = None
    heartbeat_at: float = 0.0
    report: StepReport | None = None
    report_at: float = 0.0


@dataclass
class ClusterState:
    node_ttl_s: float = NODE_TTL_S
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    plan: bus_pb2.Plan | None = None
    leader: str = ""
    series: deque[tuple[float, float, int]] = field(default_factory=lambda: deque(maxlen=SERIES_POINTS))
    latencies: deque[tuple[float, float | None, list[float]]] = field(default_factory=deque)

    # -- inputs --------------------------------------------------------------------------------

    def on_heartbeat(self, heartbeat: bus_pb2.Heartbeat, now: float) -> None:
        record = self.nodes.setdefault(heartbeat.node_id, NodeRecord())
        record.heartbeat, record.heartbeat_at = heartbeat, now

    def on_step_report(self, report: StepReport, now: float) -> None:
        record = self.nodes.setdefault(report.node_id, NodeRecord())
        record.report, record.report_at = report, now

    def on_request_report(self, report: RequestReport, now: float) -> None:
        for sample in report.requests:
            self.latencies.append((now, sample.ttft_s, sample.gaps_s))
        self._forget_old_latencies(now)

    def tick(self, now: float, wall: float) -> None:
        """One point of the series: the cluster's output tokens/s and stage-0 queue depth now."""
        self._forget_old_latencies(now)
        live = [r.report for r in self._live_records(now) if r.report is not None]
        tokens = sum(r.emitted / r.window_s for r in live if r.stage == r.num_stages - 1 and r.window_s > 0)
        queue = sum(r.queue_depth for r in live if r.stage == 0)
        self.series.append((wall, tokens, queue))

    # -- derived ---------------------------------------------------------------------------------

    def is_up(self, record: NodeRecord, now: float) -> bool:
        return now - max(record.heartbeat_at, record.report_at) <= self.node_ttl_s

    def _live_records(self, now: float) -> list[NodeRecord]:
        return [r for r in self.nodes.values() if self.is_up(r, now)]

    def pipeline_has_work(self, pipeline: int, now: float) -> bool:
        """Stage 0 of `pipeline` had sequences running or requests waiting in its last report."""
        return any(
            r.report.pipeline == pipeline
            and r.report.stage == 0
            and (r.report.running or r.report.queue_depth)
            for r in self._live_records(now)
            if r.report is not None
        )

    def node_view(self, node_id: str, record: NodeRecord, now: float) -> NodeView:
        hb, report = record.heartbeat, record.report
        up = self.is_up(record, now)
        view = NodeView(
            node_id=node_id,
            up=up,
            backend=(report.runtime if report else hb.backend if hb else "") or "",
            device=(report.device if report else hb.device if hb else "") or "",
            weights_format=(report.weights_format if report else hb.weights_format if hb else "") or "",
            memory_limit_bytes=(report.memory_limit_bytes if report else hb.memory_limit_bytes if hb else 0),
            loaded=bool(hb.loaded) if hb else False,
            security_rejections=dict(hb.security_rejections) if hb else {},
        )
        if report is None or not up:
            return view
        busy = min(1.0, report.busy_s / report.window_s) if report.window_s > 0 else 0.0
        has_work = report.pipeline >= 0 and self.pipeline_has_work(report.pipeline, now)
        view.memory_used_bytes = report.rss_bytes
        view.pipeline, view.stage, view.start, view.end = (
            report.pipeline,
            report.stage,
            report.start,
            report.end,
        )
        view.busy_share = busy
        view.bubble_share = (1.0 - busy) if has_work and report.stage >= 0 else 0.0
        view.tokens_per_s = report.tokens / report.window_s if report.window_s > 0 else 0.0
        view.steps_per_s = report.steps / report.window_s if report.window_s > 0 else 0.0
        view.batch_size = report.sequences / report.steps if report.steps else 0.0
        view.queue_depth, view.running = report.queue_depth, report.running
        view.kv_blocks_total = report.kv_blocks_total
        view.kv_blocks_used = report.kv_blocks_used or self._stage0_kv_used(report.pipeline, now)
        view.hop_ms_p50, view.hop_ms_p99 = report.hop_ms_p50, report.hop_ms_p99
        return view

    def _stage0_kv_used(self, pipeline: int, now: float) -> int:
        """Every stage of a pipeline holds the blocks its stage 0 handed out."""
        for record in self._live_records(now):
            r = record.report
            if r is not None and r.pipeline == pipeline and r.stage == 0:
                return r.kv_blocks_used
        return 0

    def pipeline_tokens_per_s(self, pipeline: int, now: float) -> float:
        return sum(
            r.report.emitted / r.report.window_s
            for r in self._live_records(now)
            if r.report is not None
            and r.report.pipeline == pipeline
            and r.report.stage == r.report.num_stages - 1
            and r.report.window_s > 0
        )

    def latency_percentiles(self, now: float) -> tuple[Percentiles, Percentiles]:
        """(time to first token, inter-token latency) in ms over the last minute's requests."""
        self._forget_old_latencies(now)
        ttfts = [t * 1000 for _, t, _ in self.latencies if t is not None]
        gaps = [g * 1000 for _, _, gs in self.latencies for g in gs]
        return _percentiles(ttfts), _percentiles(gaps)

    def _forget_old_latencies(self, now: float) -> None:
        while self.latencies and now - self.latencies[0][0] > LATENCY_WINDOW_S:
            self.latencies.popleft()

    def security_rejections(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for record in self.nodes.values():
            if record.heartbeat is not None:
                for reason, count in record.heartbeat.security_rejections.items():
                    totals[reason] = totals.get(reason, 0) + int(count)
        return totals

    def snapshot(self, now: float | None = None) -> ClusterSnapshot:
        now = time.monotonic() if now is None else now
        plan = self.plan
        plan_view = PlanView()
        if plan is not None:
            plan_view = PlanView(
                version=plan.version,
                state=plan.state,
                leader=self.leader or plan.leader,
                pipelines=[
                    PipelineView(
                        id=p.id,
                        epoch=p.epoch,
                        active=p.active,
                        stages=[
                            StageView(node_id=s.node_id, stage=i, start=s.start, end=s.end)
                            for i, s in enumerate(p.stages)
                        ],
                        tokens_per_s=self.pipeline_tokens_per_s(p.id, now),
                    )
                    for p in pipelines(plan)
                ],
                spares=list(plan.spares),
                quarantined=list(plan.quarantined),
            )
        elif self.leader:
            plan_view.leader = self.leader
        ttft, itl = self.latency_percentiles(now)
        points = list(self.series)
        return ClusterSnapshot(
            time=time.time(),
            model=plan.model if plan is not None else "",
            plan=plan_view,
            nodes=[self.node_view(n, r, now) for n, r in sorted(self.nodes.items())],
            series=Series(
                t=[p[0] for p in points],
                tokens_per_s=[p[1] for p in points],
                queue_depth=[p[2] for p in points],
            ),
            ttft_ms=ttft,
            itl_ms=itl,
            security_rejections=self.security_rejections(),
        )


def _percentiles(values: Iterable[float]) -> Percentiles:
    ordered = sorted(values)
    if not ordered:
        return Percentiles()

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return Percentiles(p50=at(0.5), p95=at(0.95), p99=at(0.99), count=len(ordered))
