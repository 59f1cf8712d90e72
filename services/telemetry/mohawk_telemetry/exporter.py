"""The whole cluster's Prometheus metrics, from `ClusterState` at every scrape (`metric_names.py`
lists them). Stage and node figures are gauges computed when Prometheus asks; rejections are the
nodes' own cumulative counts; latencies are histograms filled as request reports arrive."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mohawk_common.telemetry import RequestReport
from mohawk_telemetry.cluster_state import ClusterState
from mohawk_telemetry.metric_names import BY_NAME, NODE_LABELS, STAGE_LABELS

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)

# stage gauge -> the NodeView field it shows
_STAGE_GAUGES = {
    "mohawk_stage_busy_share": "busy_share",
    "mohawk_stage_bubble_share": "bubble_share",
    "mohawk_stage_tokens_per_second": "tokens_per_s",
    "mohawk_stage_steps_per_second": "steps_per_s",
    "mohawk_stage_batch_size": "batch_size",
    "mohawk_stage_queue_depth": "queue_depth",
    "mohawk_stage_running": "running",
    "mohawk_kv_blocks_used": "kv_blocks_used",
    "mohawk_hop_p50_seconds": "hop_ms_p50",
    "mohawk_hop_p99_seconds": "hop_ms_p99",
}


def _family(name: str) -> GaugeMetricFamily:
    metric = BY_NAME[name]
    return GaugeMetricFamily(name, metric.help, labels=list(metric.labels))


class ClusterCollector(Collector):
    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        now = time.monotonic()
        state = self.state
        plan = state.plan
        model = plan.model if plan is not None else ""
        families = {name: _family(name) for name in [*_STAGE_GAUGES, "mohawk_kv_blocks_free"]}
        node_families = {
            n: _family(n)
            for n in ("mohawk_node_memory_used_bytes", "mohawk_node_memory_limit_bytes", "mohawk_node_up")
        }
        security = CounterMetricFamily(
            "mohawk_security_rejections",
            BY_NAME["mohawk_security_rejections_total"].help,
            labels=["node", "reason"],
        )
        rejections = CounterMetricFamily(
            "mohawk_stage_rejections",
            BY_NAME["mohawk_stage_rejections_total"].help,
            labels=["model", "node", "reason"],
        )
        for node_id, record in sorted(state.nodes.items()):
            view = state.node_view(node_id, record, now)
            revision = record.heartbeat.model_id if record.heartbeat is not None else ""
            node_labels = dict(model=model, runtime=view.backend, device=view.device, node=node_id)
            node_families["mohawk_node_up"].add_metric(
                [node_labels[k] for k in NODE_LABELS], 1.0 if view.up else 0.0
            )
            node_families["mohawk_node_memory_limit_bytes"].add_metric(
                [node_labels[k] for k in NODE_LABELS], view.memory_limit_bytes
            )
            for reason, count in view.security_rejections.items():
                security.add_metric([node_id, reason], count)
            if record.report is not None:
                rejections.add_metric([model, node_id, "failed_step"], record.report.failed_steps)
                rejections.add_metric([model, node_id, "expired_step"], record.report.expired_steps)
            if not view.up:
                continue
            node_families["mohawk_node_memory_used_bytes"].add_metric(
                [node_labels[k] for k in NODE_LABELS], view.memory_used_bytes
            )
            if view.stage < 0:
                continue
            labels = dict(
                model=model,
                revision=revision,
                quant=view.weights_format,
                runtime=view.backend,
                device=view.device,
                node=node_id,
                stage=str(view.stage),
                pipeline=str(view.pipeline),
            )
            values = [labels[k] for k in STAGE_LABELS]
            for name, attribute in _STAGE_GAUGES.items():
                value = float(getattr(view, attribute))
                families[name].add_metric(values, value / 1000 if name.endswith("_seconds") else value)
            families["mohawk_kv_blocks_free"].add_metric(
                values, max(0, view.kv_blocks_total - view.kv_blocks_used)
            )
        yield from families.values()
        yield from node_families.values()
        yield security
        yield rejections
        pipeline_family = _family("mohawk_pipeline_tokens_per_second")
        plan_version, plan_active = _family("mohawk_plan_version"), _family("mohawk_plan_active")
        leader = _family("mohawk_leader_info")
        if plan is not None:
            for pipeline in plan.pipelines or []:
                pipeline_family.add_metric(
                    [model, str(pipeline.id)], state.pipeline_tokens_per_s(pipeline.id, now)
                )
            plan_version.add_metric([model], plan.version)
            plan_active.add_metric([model], 1.0 if plan.state == "active" else 0.0)
        if state.leader:
            leader.add_metric([state.leader], 1.0)
        yield from (pipeline_family, plan_version, plan_active, leader)


class Exporter:
    """One registry: the cluster collector, and the request histograms and counters."""

    def __init__(self, state: ClusterState) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(ClusterCollector(state))
        r = self.registry
        self.ttft = Histogram(
            "mohawk_time_to_first_token_seconds",
            BY_NAME["mohawk_time_to_first_token_seconds"].help,
            ["model", "tenant"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "mohawk_inter_token_latency_seconds",
            BY_NAME["mohawk_inter_token_latency_seconds"].help,
            ["model", "tenant"],
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "mohawk_output_tokens",
            BY_NAME["mohawk_output_tokens_total"].help,
            ["model", "tenant"],
            registry=r,
        )
        self.requests = Counter(
            "mohawk_requests",
            BY_NAME["mohawk_requests_total"].help,
            ["model", "tenant", "outcome"],
            registry=r,
        )

    def on_request_report(self, report: RequestReport) -> None:
        for sample in report.requests:
            labels = (sample.model, sample.tenant or "anonymous")
            if sample.ttft_s is not None:
                self.ttft.labels(*labels).observe(sample.ttft_s)
            for gap in sample.gaps_s:
                self.itl.labels(*labels).observe(gap)
            self.tokens.labels(*labels).inc(sample.tokens)
            self.requests.labels(*labels, sample.outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
