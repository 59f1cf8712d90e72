"""ClusterState and the exporter: what the telemetry service derives from step and request
reports (busy and bubble shares, tokens/s per stage and pipeline, latency percentiles)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from mohawk_common.telemetry import RequestReport, RequestSample, StepReport
from mohawk_proto.v1 import bus_pb2
from mohawk_telemetry.cluster_state import ClusterState
from mohawk_telemetry.exporter import Exporter
from mohawk_telemetry.metric_names import BY_NAME


def report(node: str, stage: int, **fields: object) -> StepReport:
    base: dict[str, object] = dict(
        node_id=node, model="m", runtime="torch", device="cpu", pipeline=0, epoch=3
    )
    base.update(
        stage=stage, num_stages=3, start=stage * 10, end=stage * 10 + 10, window_s=1.0, kv_blocks_total=100
    )
    base.update(fields)
    return StepReport(**base)  # type: ignore[arg-type]


def three_stages(state: ClusterState, now: float) -> None:
    plan = bus_pb2.Plan(version=3, model="m", state="active")
    plan.stages.extend(bus_pb2.PlanStage(node_id=f"n{i}", start=i * 10, end=i * 10 + 10) for i in range(3))
    state.plan = plan
    state.on_step_report(
        report(
            "n0",
            0,
            busy_s=0.6,
            steps=20,
            tokens=160,
            sequences=160,
            running=8,
            queue_depth=2,
            kv_blocks_used=40,
        ),
        now,
    )
    state.on_step_report(report("n1", 1, busy_s=0.3, steps=20, tokens=160, sequences=160), now)
    state.on_step_report(report("n2", 2, busy_s=0.9, steps=20, tokens=160, sequences=160, emitted=150), now)
    for i in range(3):
        state.on_heartbeat(
            bus_pb2.Heartbeat(node_id=f"n{i}", backend="torch", device="cpu", loaded=True), now
        )


def test_busy_bubble_and_tokens_per_stage_and_pipeline() -> None:
    state = ClusterState(node_ttl_s=5.0)
    three_stages(state, now=100.0)
    snap = state.snapshot(now=100.5)
    views = {n.node_id: n for n in snap.nodes}
    assert [round(views[n].busy_share, 2) for n in ("n0", "n1", "n2")] == [0.6, 0.3, 0.9]
    assert [round(views[n].bubble_share, 2) for n in ("n0", "n1", "n2")] == [
        0.4,
        0.7,
        0.1,
    ]  # stage 0 had work
    assert views["n1"].tokens_per_s == 160 and views["n1"].batch_size == 8 and views["n1"].steps_per_s == 20
    assert views["n1"].kv_blocks_used == 40  # stage 0's blocks are every stage's
    assert snap.plan.pipelines[0].tokens_per_s == 150
    state.tick(100.5, 1_000.0)
    assert snap.plan.version == 3 and state.series[-1][1:] == (150.0, 2)


def test_an_idle_pipeline_has_no_bubble_and_a_silent_node_is_down() -> None:
    state = ClusterState(node_ttl_s=5.0)
    state.on_step_report(report("n0", 0, busy_s=0.0), 100.0)
    state.on_step_report(report("n1", 1, busy_s=0.0), 100.0)
    views = {n.node_id: n for n in state.snapshot(now=101.0).nodes}
    assert views["n0"].bubble_share == views["n1"].bubble_share == 0.0
    later = {n.node_id: n for n in state.snapshot(now=106.0).nodes}
    assert not later["n0"].up and later["n0"].stage == -1


def test_latency_percentiles_cover_the_last_minute() -> None:
    state = ClusterState()
    old = RequestSample(model="m", ttft_s=9.0, gaps_s=[9.0], tokens=2)
    state.on_request_report(RequestReport(gateway="g", requests=[old]), 0.0)
    samples = [
        RequestSample(model="m", ttft_s=i / 100, gaps_s=[0.01 * i, 0.02], tokens=3) for i in range(1, 101)
    ]
    state.on_request_report(RequestReport(gateway="g", requests=samples), 61.0)  # the old one leaves
    ttft, itl = state.latency_percentiles(61.0)
    assert (ttft.count, ttft.p50, ttft.p99) == (100, 510.0, 1000.0)
    assert itl.count == 200 and itl.p50 == 20.0


def test_the_exporter_labels_stages_by_node_and_stage() -> None:
    state = ClusterState()
    import time

    three_stages(state, now=time.monotonic())
    exporter = Exporter(state)
    exporter.on_request_report(
        RequestReport(
            gateway="g",
            requests=[RequestSample(model="m", tenant="acme", ttft_s=0.2, gaps_s=[0.05], tokens=2)],
        )
    )
    families = {f.name: f for f in text_string_to_metric_families(exporter.render().decode())}
    busy = {
        (s.labels["node"], s.labels["stage"]): s.value for s in families["mohawk_stage_busy_share"].samples
    }
    assert busy == {("n0", "0"): 0.6, ("n1", "1"): 0.3, ("n2", "2"): 0.9}
    kv = {s.labels["node"]: s.value for s in families["mohawk_kv_blocks_used"].samples}
    assert kv == {"n0": 40, "n1": 40, "n2": 40}
    sample = families["mohawk_stage_tokens_per_second"].samples[0]
    assert set(sample.labels) == set(BY_NAME["mohawk_stage_tokens_per_second"].labels)
    ttft = families["mohawk_time_to_first_token_seconds"]
    assert any(
        s.name.endswith("_count") and s.labels["tenant"] == "acme" and s.value == 1 for s in ttft.samples
    )
    # exactly the families the list (and so Grafana's dashboard) names
    exported = {n for n in families if not n.endswith("_created")}  # the client's creation stamps
    assert {n if n in BY_NAME else f"{n}_total" for n in exported} == set(BY_NAME)
