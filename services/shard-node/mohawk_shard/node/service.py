"""A shard node's life: connect, measure itself, heartbeat, follow the plan, serve whatever stage it holds.

The node publishes a heartbeat every second (what it offers the planner, and which plan version it
has loaded). It watches the plan key and serves the one pipeline of it that names this node
(`node_view`): a pipeline new to the node makes it load exactly its layer range (reusing the
weights it holds when the range is unchanged) with the pipeline's KV block count, and serve it — a
stage-1+ worker subscribes at once so no frame is missed, while stage 0 starts pulling requests
only once the pipeline is active, that is, once every stage of it reported loaded. A version that
keeps the node's pipeline as it was (same epoch, stages and KV) changes nothing on the node, so
plan changes elsewhere in the cluster never interrupt it. A version that leaves the node out (a
spare, or gone from the plan) stops its stage and frees the memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psutil
import structlog
from nats.aio.client import Client

from mohawk_common.bus import names
from mohawk_common.bus.config import served_model_name
from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import decode_json, encode_json
from mohawk_common.bus.pipelines import ACTIVE, node_view, pipeline_id, pipelines, same_assignment
from mohawk_common.bus.security import Security
from mohawk_common.bus.setup import ensure_buckets, ensure_streams
from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import ModelSource, open_model
from mohawk_common.model_store.slice_fetch import fetch_slice_source
from mohawk_common.tasks import cancel_and_wait
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.backends import make_backend
from mohawk_shard.backends.base import Backend
from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.emitter import TokenEmitter
from mohawk_shard.engine.scheduler import Scheduler, SchedulerConfig
from mohawk_shard.node.capacity import Capacity, measure_capacity
from mohawk_shard.node.config import NodeSettings
from mohawk_shard.node.head import HeadDriver
from mohawk_shard.node.link import StageLink
from mohawk_shard.node.memory_trim import IdleTrim, load_malloc_trim
from mohawk_shard.node.tokens import TokenPublisher
from mohawk_shard.node.worker import StageWorker
from mohawk_shard.stage import Stage

log = structlog.get_logger("mohawk.shard")

MAX_HELD_IN_HEARTBEAT = 1024  # ack subjects a heartbeat lists (~90 bytes each); the rest wait their ack wait


class ShardNode:
    def __init__(self, settings: NodeSettings, security: Security) -> None:
        self.settings = settings
        self.security = security
        self.node_id = names.check_id("node id", settings.node_id)
        self.model = served_model_name(settings.model, settings.served_model_name)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mohawk-compute")
        self._log = log.bind(node_id=self.node_id)
        self._started_at_ms = int(time.time() * 1000)
        self._plan: bus_pb2.Plan | None = None  # the whole plan last followed
        self._view: bus_pb2.Plan | None = None  # the pipeline this node serves in it (node_view)
        self._stage_index = -1
        self._loaded = False
        self._backend: Backend | None = None
        self._role: HeadDriver | StageWorker | None = None
        self._head_started = False
        self._stop = asyncio.Event()
        self._held: tuple[int, int] | None = None
        self._failed_steps = 0  # of roles already stopped
        self._expired_steps = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        if self.settings.num_threads is not None:
            import torch

            torch.set_num_threads(self.settings.num_threads)
        self.nc: Client = await connect(self.settings.nats_servers, name=f"shard-{self.node_id}")
        self.js = self.nc.jetstream()
        self.source = await self._open_source()
        self.tokenizer = await loop.run_in_executor(self.executor, self.source.load_tokenizer)
        self.capacity: Capacity = await loop.run_in_executor(self.executor, self._measure)
        self._log.info(
            "node measured",
            device=self.capacity.device,
            seconds_per_layer=round(self.capacity.seconds_per_layer, 6),
            memory_limit_mb=self.capacity.memory_limit_bytes >> 20,
        )
        limits = self.settings.bus_limits()
        await ensure_streams(self.js, limits)
        self.buckets = await ensure_buckets(self.js, limits)
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        watcher = asyncio.create_task(self._watch_plan())
        revocations = asyncio.create_task(self.security.follow_revocations(self.buckets.pki))
        self._log.info("node up", model=self.model, nats=self.settings.nats_url, secure=self.security.secure)
        await self._stop.wait()
        await cancel_and_wait(heartbeat, watcher, revocations)
        await self._stop_role()
        with contextlib.suppress(Exception):
            await self.nc.drain()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        self._stop.set()

    async def _open_source(self) -> ModelSource:
        """The model file, or this node's slice package from the object store, verified first."""
        if self.settings.weights_from == "disk":
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, open_model, self.settings.model)
        bundle = self.security.require()
        try:
            source = await fetch_slice_source(
                self.js, self.model, self.node_id, bundle.identity, bundle.trust
            )
        except AuthenticationError as exc:
            self.security.reject(exc, what="slice package")
            raise ModelLoadError(f"the slice package for {self.node_id} was refused ({exc.reason})") from exc
        self._held = (source.layer_start, source.layer_end)
        self._log.info("slice package verified", layers=f"[{source.layer_start}, {source.layer_end})")
        return source

    def _measure(self) -> Capacity:
        s = self.settings
        return measure_capacity(
            self.source,
            backend=s.backend,
            device=s.device,
            dtype=s.dtype,
            weights=s.weights,
            kv_cache_dtype=s.kv_cache_dtype,
            block_size=s.block_size,
            memory_limit_mb=s.memory_limit_mb,
            kv_cache_memory_mb=s.kv_cache_memory_mb,
            held=self._held,
        )

    # -- heartbeat -------------------------------------------------------------------------------

    def heartbeat(self) -> bus_pb2.Heartbeat:
        c = self.capacity
        heartbeat = bus_pb2.Heartbeat(
            node_id=self.node_id,
            role="shard",
            model=self.model,
            backend=self.settings.backend,
            device=c.device,
            total_memory_bytes=c.total_memory_bytes,
            free_memory_bytes=c.free_memory_bytes(),
            memory_limit_bytes=c.memory_limit_bytes,
            kv_cache_bytes=c.kv_cache_bytes,
            kv_block_bytes_per_layer=c.kv_block_bytes_per_layer,
            seconds_per_layer=c.seconds_per_layer,
            plan_version=self._plan.version if self._plan is not None and self._stage_index >= 0 else 0,
            stage=self._stage_index,
            loaded=self._loaded,
            sent_at=time.time(),
            started_at_ms=self._started_at_ms,
            insecure=not self.security.secure,
        )
        self._describe_model(heartbeat)
        heartbeat.security_rejections.update(self.security.rejections)
        if self._held is not None:
            heartbeat.held_layer_start, heartbeat.held_layer_end = self._held
        heartbeat.failed_steps, heartbeat.expired_steps = self._step_counts()
        if isinstance(self._role, HeadDriver):
            heartbeat.held_requests.extend(self._role.held_acks(MAX_HELD_IN_HEARTBEAT))
        if self._role is not None:
            hops = self._role.hops
            heartbeat.hop_ms_p50 = hops.percentile_ms(0.5)
            heartbeat.hop_ms_p99 = hops.percentile_ms(0.99)
            heartbeat.num_hops = hops.num_hops
        return heartbeat

    def _step_counts(self) -> tuple[int, int]:
        """Steps this node failed, and (stage 0) steps it gave up waiting for, since it started."""
        role = self._role
        failed = self._failed_steps + (role.num_failed_steps if role is not None else 0)
        expired = self._expired_steps + (role.deadlines.num_expired if isinstance(role, HeadDriver) else 0)
        return failed, expired

    def _describe_model(self, heartbeat: bus_pb2.Heartbeat) -> None:
        """The model's shape and this node's weight bytes: all the coordinator needs to plan."""
        config, c = self.source.config, self.capacity
        heartbeat.model_id = config.model_id
        heartbeat.num_layers = config.num_layers
        heartbeat.hidden_size = config.hidden_size
        heartbeat.vocab_size = config.vocab_size
        heartbeat.num_kv_heads = config.num_kv_heads
        heartbeat.head_dim = config.head_dim
        heartbeat.max_position_embeddings = config.max_position_embeddings
        heartbeat.layer_weight_bytes = c.layer_weight_bytes
        heartbeat.embedding_weight_bytes = c.embedding_weight_bytes
        heartbeat.head_weight_bytes = c.head_weight_bytes
        heartbeat.weights_format = c.weights_format

    async def _heartbeat_loop(self) -> None:
        """A heartbeat every interval; also where an idle node gives freed heap back (`memory_trim`)."""
        subject = names.heartbeat_subject(self.node_id)
        trim, idle = load_malloc_trim(), IdleTrim()
        while True:
            with contextlib.suppress(Exception):
                await self.nc.publish(subject, encode_json(self.heartbeat()))
            if trim is not None:
                with contextlib.suppress(Exception):
                    await self._trim_if_idle(trim, idle)
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def _trim_if_idle(self, trim: Callable[[], None], idle: IdleTrim) -> None:
        """Give freed heap back once the role's step counter has stood still. A method, so the
        loop above holds no reference to a role across its sleep: a role the node replaces (and
        its weights and KV pool) must be freed before the next one loads."""
        if self._role is None or not idle.due(self._role.num_steps, time.monotonic()):
            return
        before = psutil.Process().memory_info().rss
        await asyncio.get_running_loop().run_in_executor(self.executor, trim)
        after = psutil.Process().memory_info().rss
        self._log.info(
            "idle: freed heap given back",
            rss_mb=after >> 20,
            given_mb=(before - after) >> 20,
            python_blocks=sys.getallocatedblocks(),  # live Python objects, for leak hunts
        )

    # -- plan ------------------------------------------------------------------------------------

    async def _watch_plan(self) -> None:
        watcher = await self.buckets.plan.watch(names.PLAN_KEY)
        async for entry in watcher:
            if entry is None or not entry.value:
                continue
            try:
                plan = decode_json(bus_pb2.Plan, entry.value)
            except Exception as exc:
                self._log.warning("unreadable plan ignored", error=str(exc))
                continue
            if plan.model != self.model:
                continue
            try:
                await self._follow(plan)
            except Exception:
                self._log.exception("could not follow plan", plan=plan.version)

    async def _follow(self, plan: bus_pb2.Plan) -> None:
        current = self._plan
        if current is not None and plan.version < current.version:
            return
        found = node_view(plan, self.node_id)
        if found is None:
            await self._stop_role()
            self._plan, self._view, self._stage_index, self._backend = plan, None, -1, None
            self._log.info("not in plan", plan=plan.version, spare=self.node_id in plan.spares)
            return
        view, index = found
        keeps = (
            self._role is not None
            and self._view is not None
            and index == self._stage_index
            and same_assignment(self._view, view)
        )
        if keeps:
            self._plan, self._view = plan, view  # the pipeline is unchanged: keep serving it
        else:
            await self._stop_role()
            self._plan, self._view, self._stage_index = plan, view, index
            await self._start_role(view)
        if isinstance(self._role, HeadDriver):  # which routed requests it must also serve
            active = {p.id for p in pipelines(plan) if p.active}
            self._role.active_routes = active
            self._role.drains_routes = bool(active) and pipeline_id(view) == min(active)
        if view.state == ACTIVE and isinstance(self._role, HeadDriver) and not self._head_started:
            self._head_started = True
            await self._role.start()

    async def _start_role(self, plan: bus_pb2.Plan) -> None:
        placement = plan.stages[self._stage_index]
        loop = asyncio.get_running_loop()
        stage, backend = await loop.run_in_executor(
            self.executor, self._load, placement.start, placement.end, plan
        )
        is_last = self._stage_index == len(plan.stages) - 1
        link = StageLink(self.nc, self.security, node_id=self.node_id, plan=plan, stage=self._stage_index)
        tokens = None
        if is_last:
            emitter = TokenEmitter(self.tokenizer, self.source.config.eos_token_ids, plan.max_model_len)
            tokens = TokenPublisher(self.nc, emitter)
        if self._stage_index == 0:
            scheduler = Scheduler(
                SchedulerConfig(
                    self.settings.max_num_seqs, self.settings.max_num_batched_tokens, plan.max_model_len
                ),
                BlockManager(
                    plan.num_kv_blocks,
                    plan.block_size,
                    enable_prefix_caching=self.settings.enable_prefix_caching,
                ),
            )
            self._role = HeadDriver(
                nc=self.nc,
                js=self.js,
                link=link,
                security=self.security,
                plan=plan,
                stage=stage,
                scheduler=scheduler,
                executor=self.executor,
                vocab_size=self.source.config.vocab_size,
                tokens=tokens,
                max_inflight_steps=self.settings.max_inflight_steps,
                ack_wait_s=self.settings.request_ack_wait_s,
                max_waiting=self.settings.max_waiting,
                step_deadline_floor_s=self.settings.step_deadline_floor_s,
            )
            self._head_started = False
        else:
            self._role = StageWorker(
                nc=self.nc,
                link=link,
                plan=plan,
                stage_index=self._stage_index,
                stage=stage,
                executor=self.executor,
                tokens=tokens,
            )
            await self._role.start()
        self._loaded = True
        self._log.info(
            "stage loaded",
            plan=plan.version,
            stage=self._stage_index,
            layers=f"[{placement.start}, {placement.end})",
            weight_mb=round(backend.weight_bytes / 2**20, 1),
            num_kv_blocks=plan.num_kv_blocks,
        )

    def _load(self, start: int, end: int, plan: bus_pb2.Plan) -> tuple[Stage, Backend]:
        backend = self._backend
        if backend is None or (backend.start, backend.end) != (start, end):
            self._backend = None  # let the old weights go before the new ones load
            s = self.settings
            backend = make_backend(
                s.backend,
                self.source,
                start,
                end,
                device=s.device,
                dtype=s.dtype,
                weights=s.weights,
                kv_cache_dtype=s.kv_cache_dtype,
            )
        backend.allocate_kv_cache(plan.num_kv_blocks, plan.block_size)
        self._backend = backend
        return Stage(backend, plan.block_size), backend

    async def _stop_role(self) -> None:
        self._failed_steps, self._expired_steps = self._step_counts()
        role, self._role = self._role, None
        self._loaded = False
        if role is None:
            return
        if isinstance(role, HeadDriver):
            if self._head_started:
                await role.stop()
            self._head_started = False
        else:
            await role.stop()
