"""The role a node plays in one pipeline: stage 0 (`HeadDriver`) or a later stage (`StageWorker`).

Design. The node and its plan follower see a role only through `Role`, the facts and acts every
role has (its `stage_index` and pipeline view, its counters and snapshot, start and stop), never
through an `isinstance` chain: what differs between stage 0 and the others is said by the role
(`waits_for_active`, `follow_pipelines`). `make_role` builds either from what the node offers
(`RoleHost`).
"""

from __future__ import annotations

from collections.abc import Set
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Protocol

from nats.aio.client import Client
from nats.js import JetStreamContext

from mohawk_common.bus.security import Security
from mohawk_common.kv_groups import model_kv_groups
from mohawk_common.model_store import ModelSource
from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.emitter import TokenEmitter
from mohawk_shard.engine.scheduler import Scheduler, SchedulerConfig
from mohawk_shard.engine.stage import Stage
from mohawk_shard.node.compute import StageCompute
from mohawk_shard.node.config import NodeSettings
from mohawk_shard.node.head import HeadDriver
from mohawk_shard.node.hops import HopStats
from mohawk_shard.node.link import StageLink
from mohawk_shard.node.pipeline_view import PipelineView
from mohawk_shard.node.snapshot import StageSnapshot
from mohawk_shard.node.tokens import EventRoute, TokenPublisher
from mohawk_shard.node.traces import StageTraces
from mohawk_shard.node.worker import StageWorker

if TYPE_CHECKING:  # the node's bus path loads no transformers (tests/shard/node/test_node_imports.py)
    from transformers import PreTrainedTokenizerBase


class Role(Protocol):
    """What the node knows of the stage it serves, whichever it is."""

    stage_index: int
    view: PipelineView  # the pipeline it serves
    hops: HopStats
    num_steps: int  # frames or steps handled (the node's idle detection watches it)
    num_failed_steps: int
    compute: StageCompute  # its layers' step (its stage, until the role stops)

    @property
    def num_expired_steps(self) -> int: ...

    @property
    def waits_for_active(self) -> bool:
        """True: start the role once its pipeline is active; False: as soon as it is loaded."""
        ...

    def stage_snapshot(self) -> StageSnapshot: ...

    def follow_pipelines(self, active: Set[int], *, drains: bool) -> None:
        """The plan's active pipelines now, and whether this role drains the others' routes."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class RoleHost(Protocol):
    """What building a role reads of the node that will run it (`ShardNode` is one)."""

    @property
    def nc(self) -> Client: ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def security(self) -> Security: ...

    @property
    def node_id(self) -> str: ...

    @property
    def source(self) -> ModelSource: ...

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...

    @property
    def executor(self) -> Executor: ...

    @property
    def settings(self) -> NodeSettings: ...

    def beat_soon(self) -> None: ...


def make_role(node: RoleHost, view: PipelineView, index: int, stage: Stage) -> Role:
    """Stage `index` of the pipeline `view`, built but not started."""
    is_last = index == view.num_stages - 1
    link = StageLink(node.nc, node.security, node_id=node.node_id, view=view, stage=index)
    placed = view.stages[index]
    traces = StageTraces(
        stage_index=index,
        node_id=node.node_id,
        layers=(placed.start, placed.end),
        plan_version=view.epoch,
        pipeline=view.pipeline,
    )
    tokens = None
    if is_last:
        eos = node.source.config.eos_token_ids
        emitter = TokenEmitter[EventRoute](node.tokenizer, eos, view.max_model_len)
        tokens = TokenPublisher(node.nc, emitter)
    if index > 0:
        return StageWorker(
            nc=node.nc,
            link=link,
            view=view,
            stage_index=index,
            stage=stage,
            executor=node.executor,
            tokens=tokens,
            traces=traces,
        )
    scheduler = Scheduler(
        SchedulerConfig(node.settings.max_num_seqs, node.settings.max_num_batched_tokens, view.max_model_len),
        BlockManager(
            view.num_kv_blocks,
            view.block_size,
            enable_prefix_caching=node.settings.enable_prefix_caching,
            groups=model_kv_groups(node.source.config),
        ),
    )
    return HeadDriver(
        nc=node.nc,
        js=node.js,
        link=link,
        security=node.security,
        view=view,
        stage=stage,
        scheduler=scheduler,
        executor=node.executor,
        vocab_size=node.source.config.vocab_size,
        tokens=tokens,
        max_inflight_steps=node.settings.max_inflight_steps,
        ack_wait_s=node.settings.request_ack_wait_s,
        max_waiting=node.settings.max_waiting,
        step_deadline_floor_s=node.settings.step_deadline_floor_s,
        max_resumes=node.settings.max_resumes,
        traces=traces,
        on_hold=node.beat_soon,
    )
