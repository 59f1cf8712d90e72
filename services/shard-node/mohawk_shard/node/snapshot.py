"""What a shard node is doing, as plain values: one `NodeSnapshot`, taken by the node once per
heartbeat tick (`ShardNode.snapshot()`), feeds its heartbeat and its telemetry report, and one
taken when /metrics is scraped feeds the scrape.

Design. The readers (`metrics.py`, `step_stats.step_report`) used to reach into the node and its
role and ask `isinstance(role, HeadDriver)` for stage 0's queue; they now read a snapshot and know
nothing of the node, the roles or the bus, so `node/` imports in one direction (the node builds the
snapshot, the readers read it). Each role fills its own part (`stage_snapshot()`): every stage its
place in the pipeline, step counters and hop times; stage 0 also its queue, KV blocks in use and
held requests. The plan follower adds where the node stands with the plan (`Following`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mohawk_shard.node.hops import HopStats
from mohawk_shard.node.pipeline_view import PipelineView


@dataclass
class StepStats:
    """What a role ran, counted up from its start."""

    steps: int = 0
    tokens: int = 0
    sequences: int = 0
    emitted: int = 0

    def record(self, tokens: int, sequences: int) -> None:
        self.steps += 1
        self.tokens += tokens
        self.sequences += sequences


MAX_HELD_ACKS = 1024  # ack subjects listed (~90 bytes each in a heartbeat); the rest wait their ack wait


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """Stage 0's queue: requests waiting, sequences running, KV blocks handed out, and the ack
    subjects of (at most `MAX_HELD_ACKS` of) the requests it holds off the stream."""

    waiting: int
    running: int
    kv_blocks_used: int
    held_acks: tuple[str, ...] = ()
    resumes: HopStats | None = None  # resumed requests: queued again to their next token


@dataclass(frozen=True, slots=True)
class Following:
    """Where the node stands with the plan: the version it follows (0 while the plan gives it no
    stage), the stage it was given (-1: none), whether that stage is loaded, and the layer range
    it holds warm as a standby ((0, 0): none)."""

    plan_version: int = 0
    stage_index: int = -1
    loaded: bool = False
    standby: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class StageSnapshot:
    """The stage a node runs: where it sits in its pipeline, and what it has done."""

    stage_index: int
    pipeline: int
    epoch: int  # the pipeline's (`PipelineView.epoch`)
    num_stages: int
    start: int  # first layer held
    end: int  # one past the last
    kv_blocks_total: int
    stats: StepStats  # ever-growing counters (StepWindow turns them into a window's deltas)
    hops: HopStats
    queue: QueueSnapshot | None = None  # stage 0 only


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    node_id: str
    model: str
    runtime: str  # the backend: torch or mlx
    device: str
    weights_format: str
    memory_limit_bytes: int
    busy_s: float  # time the compute thread has run the model, since the node started
    failed_steps: int  # steps this node could not run, since it started
    expired_steps: int  # stage 0: steps given up waiting for, since it started
    rss_bytes: int
    rejections: dict[str, int] = field(default_factory=dict)  # messages refused, by reason
    stage: StageSnapshot | None = None  # None while the node serves no stage
    following: Following = Following()


def stage_snapshot(
    view: PipelineView, index: int, stats: StepStats, hops: HopStats, queue: QueueSnapshot | None = None
) -> StageSnapshot:
    """Stage `index` of the pipeline `view`, with its counters."""
    placed = view.stages[index]
    return StageSnapshot(
        stage_index=index,
        pipeline=view.pipeline,
        epoch=view.epoch,
        num_stages=view.num_stages,
        start=placed.start,
        end=placed.end,
        kv_blocks_total=view.num_kv_blocks,
        stats=stats,
        hops=hops,
        queue=queue,
    )
