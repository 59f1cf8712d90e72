"""What processes report to the telemetry service, on `mohawk.v1.tel.<kind>.<process>` (JSON).

Shard nodes publish a `StepReport` every heartbeat interval: the counters of the last window
(compute time, steps, tokens, sequences, tokens emitted), stage 0's queue and KV use, hop times and
failed steps. Gateways publish a `RequestReport` every second with the requests that finished in
it (time to first token, inter-token gaps, tokens, outcome, the tenant's label, not its name).
Like heartbeats, these are control-plane records in the clear, signed by their sender
(`bus/telemetry_records.py`): counts and timings, never prompts, tokens or tenant names. The telemetry
service (`services/telemetry`) turns them into one Prometheus endpoint and the dashboard.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

STEP = "step"
REQUESTS = "req"
MAX_GAPS_PER_REQUEST = 256  # inter-token gaps a request reports (its first ones)


class StepReport(BaseModel):
    node_id: str
    model: str
    runtime: str  # torch | mlx
    device: str
    weights_format: str = ""
    pipeline: int = -1  # -1: the node serves no stage
    epoch: int = 0
    stage: int = -1
    num_stages: int = 0
    start: int = 0
    end: int = 0
    window_s: float  # the counters below cover this long
    busy_s: float = 0.0  # time its compute thread spent running the model
    steps: int = 0
    tokens: int = 0  # tokens the stage processed (prompt chunks and decode)
    sequences: int = 0  # sequence-steps (a batch of 8 is 8)
    emitted: int = 0  # tokens sampled (last stage)
    queue_depth: int = 0  # stage 0: requests waiting
    running: int = 0  # stage 0: sequences running
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    hop_ms_p50: float = 0.0
    hop_ms_p99: float = 0.0
    failed_steps: int = 0  # since the node started
    expired_steps: int = 0
    rss_bytes: int = 0
    memory_limit_bytes: int = 0
    sent_at: float = 0.0


class RequestSample(BaseModel):
    model: str
    tenant: str = ""  # its label (`Tenant.label`), never its name: "" for the anonymous tenant
    ttft_s: float | None = None
    gaps_s: list[float] = Field(default_factory=list)  # inter-token latencies
    tokens: int = 0
    outcome: str = "ok"  # ok | failed | a cancel reason (disconnect, timeout, no pipeline)


class RequestReport(BaseModel):
    gateway: str
    requests: list[RequestSample]
    sent_at: float = 0.0
