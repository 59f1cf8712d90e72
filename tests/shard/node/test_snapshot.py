"""A node's snapshot as plain values, read by /metrics, the telemetry report and the heartbeat with
no node, role or bus behind it: stage 0's queue shows only where the snapshot has one, and a node
serving no stage reports its process figures alone."""

from __future__ import annotations

import dataclasses

from prometheus_client.core import Metric

from mohawk_common.model_store import open_model
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.capacity import Capacity
from mohawk_shard.node.heartbeat import build_heartbeat
from mohawk_shard.node.hops import HopStats
from mohawk_shard.node.metrics import node_metrics
from mohawk_shard.node.pipeline_view import PipelineView
from mohawk_shard.node.snapshot import Following, NodeSnapshot, QueueSnapshot, StepStats, stage_snapshot
from mohawk_shard.node.step_stats import StepWindow, step_report


def view() -> PipelineView:
    plan = bus_pb2.Plan(version=7, num_kv_blocks=512)
    for start, end in ((0, 10), (10, 30)):
        plan.stages.add(node_id=f"n{start}", start=start, end=end)
    return PipelineView(plan)


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


def test_the_heartbeat_reads_the_snapshot() -> None:
    hops = HopStats()
    hops.record(sent_at=100.0, arrived_at=100.004)
    queue = QueueSnapshot(waiting=6, running=3, kv_blocks_used=77, held_acks=("$JS.ACK.a", "$JS.ACK.b"))
    snapshot = dataclasses.replace(
        node(queue, 0),
        stage=stage_snapshot(view(), 0, StepStats(), hops, queue),
        following=Following(plan_version=9, stage_index=0, loaded=True),
    )
    capacity = Capacity("cpu", 16 << 30, 1 << 30, 1 << 28, 1 << 20, 1e-3, 10, 5, 4, "native")
    beat = build_heartbeat(snapshot, capacity, open_model(None).config, started_at_ms=42, held_layers=(0, 10))
    assert (beat.node_id, beat.model, beat.backend, beat.memory_limit_bytes) == (
        "shard-1",
        "m",
        "torch",
        1 << 30,
    )
    assert (beat.plan_version, beat.stage, beat.loaded, beat.started_at_ms) == (9, 0, True, 42)
    assert (beat.failed_steps, beat.expired_steps, dict(beat.security_rejections)) == (
        1,
        2,
        {"bad signature": 4},
    )
    assert list(beat.held_requests) == ["$JS.ACK.a", "$JS.ACK.b"]
    assert beat.num_hops == 1 and beat.hop_ms_p50 > 0
    assert (beat.held_layer_start, beat.held_layer_end, beat.layer_weight_bytes) == (0, 10, 10)
    idle = build_heartbeat(
        dataclasses.replace(snapshot, stage=None, following=Following()),
        capacity,
        open_model(None).config,
        started_at_ms=42,
    )
    assert (idle.plan_version, idle.stage, idle.loaded, idle.num_hops, list(idle.held_requests)) == (
        0,
        -1,
        False,
        0,
        [],
    )
