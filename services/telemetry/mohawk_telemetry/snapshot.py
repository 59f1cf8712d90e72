"""What the dashboard shows: one JSON snapshot of the cluster, sent on `/api/state` and, once a
second, as an SSE `snapshot` event on `/api/events`. The page renders only these fields."""

from __future__ import annotations

from pydantic import BaseModel, Field


class StageView(BaseModel):
    node_id: str
    stage: int
    start: int  # layer range [start, end)
    end: int


class PipelineView(BaseModel):
    id: int
    epoch: int
    active: bool
    stages: list[StageView]
    tokens_per_s: float = 0.0  # output tokens the pipeline generated per second (last window)


class PlanView(BaseModel):
    version: int = 0
    state: str = ""  # active | loading | "" (none yet)
    leader: str = ""
    pipelines: list[PipelineView] = Field(default_factory=list)
    spares: list[str] = Field(default_factory=list)
    quarantined: list[str] = Field(default_factory=list)


class NodeView(BaseModel):
    node_id: str
    up: bool
    backend: str  # torch | mlx
    device: str
    weights_format: str = ""
    memory_used_bytes: int = 0  # resident memory of the node's process
    memory_limit_bytes: int = 0
    pipeline: int = -1
    stage: int = -1  # -1: not in the plan (a spare, or loading)
    start: int = 0
    end: int = 0
    loaded: bool = False
    busy_share: float = 0.0  # 0..1 of the last window spent computing
    bubble_share: float = 0.0  # 0..1 of the last window idle while its pipeline had work
    tokens_per_s: float = 0.0
    steps_per_s: float = 0.0
    batch_size: float = 0.0
    queue_depth: int = 0  # stage 0 only
    running: int = 0  # stage 0 only
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    hop_ms_p50: float = 0.0
    hop_ms_p99: float = 0.0
    security_rejections: dict[str, int] = Field(default_factory=dict)


class Percentiles(BaseModel):
    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    count: int = 0


class Series(BaseModel):
    """The last few minutes, one point a second, oldest first."""

    t: list[float] = Field(default_factory=list)  # unix seconds
    tokens_per_s: list[float] = Field(default_factory=list)  # the whole cluster's output tokens/s
    queue_depth: list[int] = Field(default_factory=list)  # requests waiting at every stage 0


class ClusterSnapshot(BaseModel):
    time: float
    model: str = ""
    plan: PlanView = Field(default_factory=PlanView)
    nodes: list[NodeView] = Field(default_factory=list)
    series: Series = Field(default_factory=Series)
    ttft_ms: Percentiles = Field(default_factory=Percentiles)  # time to first token, last minute
    itl_ms: Percentiles = Field(default_factory=Percentiles)  # inter-token latency, last minute
    security_rejections: dict[str, int] = Field(default_factory=dict)  # the cluster's, by reason
