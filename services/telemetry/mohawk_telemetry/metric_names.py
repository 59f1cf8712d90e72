"""Every metric the telemetry service exports, with its type, help and labels: the one list the
Prometheus exporter, the Grafana dashboard (config/grafana) and its test read.

Labels follow InferMesh's schema where it applies: model, revision, quant, runtime (torch|mlx),
device, node, stage, tenant; `pipeline` names a replica.
"""

from __future__ import annotations

from dataclasses import dataclass

STAGE_LABELS = ("model", "revision", "quant", "runtime", "device", "node", "stage", "pipeline")
NODE_LABELS = ("model", "runtime", "device", "node")
REQUEST_LABELS = ("model", "tenant")


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    kind: str  # gauge | counter | histogram
    help: str
    labels: tuple[str, ...]


METRICS = (
    Metric(
        "mohawk_stage_busy_share",
        "gauge",
        "share of the last window a stage spent computing steps",
        STAGE_LABELS,
    ),
    Metric(
        "mohawk_stage_bubble_share",
        "gauge",
        "share of the last window a stage of a busy pipeline sat idle waiting for the other stages",
        STAGE_LABELS,
    ),
    Metric(
        "mohawk_stage_tokens_per_second",
        "gauge",
        "tokens a stage processed per second (last window)",
        STAGE_LABELS,
    ),
    Metric(
        "mohawk_stage_steps_per_second",
        "gauge",
        "pipeline steps a stage ran per second (last window)",
        STAGE_LABELS,
    ),
    Metric("mohawk_stage_batch_size", "gauge", "mean sequences per step (last window)", STAGE_LABELS),
    Metric("mohawk_stage_queue_depth", "gauge", "requests waiting at stage 0", STAGE_LABELS),
    Metric("mohawk_stage_running", "gauge", "sequences running at stage 0", STAGE_LABELS),
    Metric("mohawk_kv_blocks_used", "gauge", "KV cache blocks in use", STAGE_LABELS),
    Metric("mohawk_kv_blocks_free", "gauge", "KV cache blocks free", STAGE_LABELS),
    Metric("mohawk_hop_p50_seconds", "gauge", "median time a frame took to reach this stage", STAGE_LABELS),
    Metric("mohawk_hop_p99_seconds", "gauge", "p99 time a frame took to reach this stage", STAGE_LABELS),
    Metric(
        "mohawk_pipeline_tokens_per_second",
        "gauge",
        "output tokens a pipeline generated per second",
        ("model", "pipeline"),
    ),
    Metric("mohawk_node_memory_used_bytes", "gauge", "resident memory of the node's process", NODE_LABELS),
    Metric(
        "mohawk_node_memory_limit_bytes", "gauge", "memory the node offers for weights and KV", NODE_LABELS
    ),
    Metric("mohawk_node_up", "gauge", "1 while the node's heartbeats arrive", NODE_LABELS),
    Metric(
        "mohawk_security_rejections_total",
        "counter",
        "messages a node refused, by reason",
        ("node", "reason"),
    ),
    Metric(
        "mohawk_stage_rejections_total",
        "counter",
        "requests stage 0 refused or failed, by reason",
        ("model", "node", "reason"),
    ),
    Metric("mohawk_plan_version", "gauge", "the placement plan's version", ("model",)),
    Metric("mohawk_plan_active", "gauge", "1 when the plan has an active pipeline", ("model",)),
    Metric("mohawk_leader_info", "gauge", "1 for the coordinator that holds the lease", ("leader",)),
    Metric(
        "mohawk_time_to_first_token_seconds",
        "histogram",
        "time to the first token, at the gateway",
        REQUEST_LABELS,
    ),
    Metric(
        "mohawk_inter_token_latency_seconds",
        "histogram",
        "time between tokens, at the gateway",
        REQUEST_LABELS,
    ),
    Metric("mohawk_output_tokens_total", "counter", "tokens generated, at the gateway", REQUEST_LABELS),
    Metric(
        "mohawk_requests_total", "counter", "requests finished, by outcome", ("model", "tenant", "outcome")
    ),
)

BY_NAME = {m.name: m for m in METRICS}
