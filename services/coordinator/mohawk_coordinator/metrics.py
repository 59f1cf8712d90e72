"""A coordinator replica's own /metrics: leadership, live nodes, its plan, quarantine, failed steps."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def replica_metrics(
    coordinator_id: str,
    *,
    is_leader: bool,
    live_nodes: int,
    plan_version: int,
    quarantined: int,
    failed_steps: int,
) -> Iterator[Metric]:
    """`plan_version` and `quarantined`: this leader's (0 on a standby); `failed_steps`: leader
    steps that failed on something other than the bus since the replica started."""
    me = [coordinator_id]
    for name, text, value in (
        ("is_leader", "1 while this replica holds the lease", float(is_leader)),
        ("live_nodes", "shard nodes whose heartbeats arrive", live_nodes),
        ("plan_version", "the plan this leader published last", plan_version),
        ("quarantined_nodes", "nodes left out for a cool-down", quarantined),
    ):
        gauge = GaugeMetricFamily(f"mohawk_coordinator_{name}", text, labels=["coordinator"])
        gauge.add_metric(me, value)
        yield gauge
    text = "leader steps failed on other than the bus"
    failed = CounterMetricFamily("mohawk_coordinator_failed_steps", text, labels=["coordinator"])
    failed.add_metric(me, failed_steps)
    yield failed
