"""A shard node's own /metrics (`metrics_port`): its compute time, steps, tokens, queue, KV and
rejections, read from the node at each scrape. Counters count since the node (or, for steps and
tokens, its current stage) started."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from mohawk_shard.node.service import ShardNode


def node_metrics(node: ShardNode) -> Iterator[Metric]:
    from mohawk_shard.node.head import HeadDriver

    role = node.role
    stage = "none" if role is None else str(role.stage_index)
    labels, values = ["node", "stage"], [node.node_id, stage]

    def counter(name: str, text: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, text, labels=labels)
        family.add_metric(values, value)
        return family

    def gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, text, labels=labels)
        family.add_metric(values, value)
        return family

    failed, expired = node.step_counts()
    yield counter("mohawk_node_busy_seconds", "time the compute thread ran the model", node.executor.busy_s)
    yield counter("mohawk_node_failed_steps", "steps this node could not run", failed)
    yield counter("mohawk_node_expired_steps", "stage 0: steps given up waiting for", expired)
    yield gauge(
        "mohawk_node_resident_bytes", "resident memory of this process", psutil.Process().memory_info().rss
    )
    rejections = CounterMetricFamily(
        "mohawk_node_security_rejections", "messages refused, by reason", labels=["node", "reason"]
    )
    for reason, count in node.security.rejections.items():
        rejections.add_metric([node.node_id, reason], count)
    yield rejections
    if role is None:
        return
    yield counter("mohawk_node_steps", "steps this stage ran", role.stats.steps)
    yield counter("mohawk_node_tokens", "tokens this stage processed", role.stats.tokens)
    yield counter("mohawk_node_emitted_tokens", "tokens this stage sampled (last stage)", role.stats.emitted)
    yield gauge(
        "mohawk_node_hop_p99_seconds",
        "p99 time a frame took to reach this stage",
        role.hops.percentile_ms(0.99) / 1000,
    )
    if isinstance(role, HeadDriver):
        scheduler = role.scheduler
        yield gauge("mohawk_node_queue_depth", "requests waiting at stage 0", len(scheduler.waiting))
        yield gauge("mohawk_node_running", "sequences running at stage 0", len(scheduler.running))
        yield gauge("mohawk_node_kv_blocks_used", "KV blocks in use", role.kv_blocks_used)
