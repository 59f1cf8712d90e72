"""A shard node's own /metrics (`metrics_port`): its compute time, steps, tokens, queue, KV and
rejections, from the node's snapshot taken at each scrape (`snapshot.py`). Counters count since
the node (or, for steps and tokens, its current stage) started."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mohawk_shard.node.snapshot import NodeSnapshot


def node_metrics(node: NodeSnapshot) -> Iterator[Metric]:
    role = node.stage
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

    yield counter("mohawk_node_busy_seconds", "time the compute thread ran the model", node.busy_s)
    yield counter("mohawk_node_failed_steps", "steps this node could not run", node.failed_steps)
    yield counter("mohawk_node_expired_steps", "stage 0: steps given up waiting for", node.expired_steps)
    yield gauge("mohawk_node_resident_bytes", "resident memory of this process", node.rss_bytes)
    rejections = CounterMetricFamily(
        "mohawk_node_security_rejections", "messages refused, by reason", labels=["node", "reason"]
    )
    for reason, count in node.rejections.items():
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
    if role.queue is not None:
        yield gauge("mohawk_node_queue_depth", "requests waiting at stage 0", role.queue.waiting)
        yield gauge("mohawk_node_running", "sequences running at stage 0", role.queue.running)
        yield gauge("mohawk_node_kv_blocks_used", "KV blocks in use", role.queue.kv_blocks_used)
        resumes = role.queue.resumes
        if resumes is not None:
            yield counter("mohawk_node_resumes", "stage 0: resumed requests caught up", resumes.num_hops)
            yield gauge(
                "mohawk_node_resume_p99_seconds",
                "stage 0: p99 time from a resumed request's queueing to its next token",
                resumes.percentile_ms(0.99) / 1000,
            )
