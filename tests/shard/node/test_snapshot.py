"""A node's snapshot as plain values, read by /metrics and the telemetry report with no node, role or
bus behind it: stage 0's queue shows only where the snapshot has one, and a node serving no stage
reports its process figures alone."""

from __future__ import annotations

import dataclasses

from prometheus_client.core import Metric

from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.hops import HopStats
from mohawk_shard.node.metrics import node_metrics
from mohawk_shard.node.snapshot import NodeSnapshot, QueueSnapshot, StepStats, stage_snapshot
from mohawk_shard.node.step_stats import StepWindow, step_report


def view() -> bus_pb2.Plan:
    plan = bus_pb2.Plan(version=7, num_kv_blocks=512)
    for start, end in ((0, 10), (10, 30)):
        plan.stages.add(node_id=f"n{start}", start=start, end=end)
    return plan


def node(queue: QueueSnapshot | None, index: int) -> NodeSnapshot:
    stats = StepStats(steps=5, tokens=40, sequences=9, emitted=3)
    return NodeSnapshot(
        node_id="shard-1",
        model="m",
        runtime="torch",
        device="cpu",
        weights_format="native",
        memory_limit_bytes=1 << 30,
        busy_s=2.5,
        failed_steps=1,
        expired_steps=2,
        rss_bytes=123,
        rejections={"bad signature": 4},
        stage=stage_snapshot(view(), index, stats, HopStats(), queue),
    )


def samples(metrics: list[Metric]) -> dict[str, float]:
    return {s.name: s.value for m in metrics for s in m.samples if s.labels.get("reason") is None}


def test_stage_0_shows_its_queue_and_a_later_stage_does_not() -> None:
    head = samples(list(node_metrics(node(QueueSnapshot(waiting=6, running=3, kv_blocks_used=77), 0))))
    assert head["mohawk_node_queue_depth"] == 6 and head["mohawk_node_kv_blocks_used"] == 77
    assert head["mohawk_node_busy_seconds_total"] == 2.5 and head["mohawk_node_expired_steps_total"] == 2
    later = samples(list(node_metrics(node(None, 1))))
    assert "mohawk_node_queue_depth" not in later and later["mohawk_node_steps_total"] == 5


def test_the_report_reads_the_snapshot() -> None:
    snapshot = node(QueueSnapshot(waiting=6, running=3, kv_blocks_used=77), 1)
    report = step_report(snapshot, StepWindow(0.0))
    assert (report.stage, report.start, report.end, report.num_stages) == (1, 10, 30, 2)
    assert (report.epoch, report.kv_blocks_total, report.queue_depth, report.kv_blocks_used) == (
        7,
        512,
        6,
        77,
    )
    assert (report.steps, report.tokens, report.failed_steps, report.rss_bytes) == (5, 40, 1, 123)
    idle = step_report(dataclasses.replace(snapshot, stage=None), StepWindow(0.0))  # serves no stage
    assert (idle.node_id, idle.steps, idle.queue_depth, idle.kv_blocks_total) == ("shard-1", 0, 0, 0)
