"""A shard node's life: connect, measure itself, heartbeat, follow the plan, serve whatever stage it holds.

The node publishes a heartbeat every second (what it offers the planner, and which plan version it
has loaded). It watches the plan key and serves the one pipeline of it that names this node
(`node_view`): a pipeline new to the node makes it load exactly its layer range (reusing the
weights it holds when the range is unchanged) with the pipeline's KV block count, and serve it — a
stage-1+ worker subscribes at once so no frame is missed, while stage 0 starts pulling requests
only once the pipeline is active, that is, once every stage of it reported loaded. A version that
keeps the node's pipeline as it was (same epoch, stages and KV) changes nothing on the node, so
plan changes elsewhere in the cluster never interrupt it. A version that gives the node another
stage makes before it breaks (`handover`): the new stage loads beside the running one, which
serves on until the new pipeline is active, where memory has room for both. A version that leaves
the node out (a spare, or gone from the plan) stops its stage and frees the memory, once a
pipeline of that version is active.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil
import structlog
from nats.aio.client import Client

from mohawk_common.bus import names
from mohawk_common.bus.config import served_model_name
from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import encode_json
from mohawk_common.bus.control_records import RecordVerifier, sign_record
from mohawk_common.bus.pipelines import ACTIVE, node_view, pipeline_id, pipelines, same_assignment
from mohawk_common.bus.plan_follower import PlanFollower, placed_on_earlier_run
from mohawk_common.bus.security import Security
from mohawk_common.bus.setup import ensure_buckets, ensure_streams
from mohawk_common.errors import ModelLoadError
from mohawk_common.kv_groups import model_kv_groups
from mohawk_common.memory_trim import IdleTrim, load_malloc_trim
from mohawk_common.metrics_port import serve_metrics
from mohawk_common.model_store import ModelSource, open_model
from mohawk_common.model_store.slice_fetch import fetch_slice_source
from mohawk_common.model_store.slice_source import SliceSource
from mohawk_common.tasks import cancel_and_wait
from mohawk_common.telemetry import STEP
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.backends import make_backend
from mohawk_shard.engine.backend import Backend
from mohawk_shard.engine.stage import Stage
from mohawk_shard.node.capacity import Capacity, measure_capacity
from mohawk_shard.node.config import NodeSettings
from mohawk_shard.node.handover import room_for_both, serving_footprint, share_weights, stage_footprint
from mohawk_shard.node.head import HeadDriver
from mohawk_shard.node.metrics import node_metrics
from mohawk_shard.node.roles import make_role
from mohawk_shard.node.snapshot import NodeSnapshot
from mohawk_shard.node.step_stats import StepWindow, TimedExecutor, step_report
from mohawk_shard.node.worker import StageWorker

log = structlog.get_logger("mohawk.shard")

MAX_HELD_IN_HEARTBEAT = 1024  # ack subjects a heartbeat lists (~90 bytes each); the rest wait their ack wait


@dataclass(slots=True)
class NextRole:
    """A stage loaded beside the running one (`handover`), waiting for its pipeline to be active."""

    view: bus_pb2.Plan
    index: int
    backend: Backend
    role: HeadDriver | StageWorker


class ShardNode:
    def __init__(self, settings: NodeSettings, security: Security) -> None:
        self.settings = settings
        self.security = security
        self.node_id = names.check_id("node id", settings.node_id)
        self.model = served_model_name(settings.model, settings.served_model_name)
        self.executor = TimedExecutor(max_workers=1, thread_name_prefix="mohawk-compute")
        self.loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mohawk-load")  # handover
        self._log = log.bind(node_id=self.node_id)
        self._started_at_ms = int(time.time() * 1000)
        self._plan: bus_pb2.Plan | None = None  # the whole plan last followed
        self._stage_index = -1
        self._loaded = False
        self._backend: Backend | None = None
        self._role: HeadDriver | StageWorker | None = None
        self._next: NextRole | None = None  # loaded beside the role, until its pipeline is active
        self._head_started = False
        self._stop = asyncio.Event()
        self._held: tuple[int, int] | None = None
        self._failed_steps = 0  # of roles already stopped
        self._expired_steps = 0
        bundle = security.bundle
        self._plans = PlanFollower(
            self.model, RecordVerifier(bundle.trust if bundle is not None else None), self._reject_record
        )

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        if self.settings.num_threads is not None:
            import torch

            torch.set_num_threads(self.settings.num_threads)
        self.nc: Client = await connect(
            self.settings.nats_servers,
            name=f"shard-{self.node_id}",
            creds=self.settings.nats_creds,
            tls_ca=self.settings.nats_tls_ca,
        )
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
        serve_metrics(
            self.settings.metrics_port, self.settings.metrics_host, lambda: node_metrics(self.snapshot())
        )
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        watcher = asyncio.create_task(self._watch_plan())
        revocations = asyncio.create_task(self.security.follow_revocations(self.buckets.pki))
        self._log.info("node up", model=self.model, nats=self.settings.nats_url, secure=self.security.secure)
        await self._stop.wait()
        await cancel_and_wait(heartbeat, watcher, revocations)
        await self._drop_next()
        await self._stop_role()
        with contextlib.suppress(Exception):
            await self.nc.drain()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.loader.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        self._stop.set()

    @property
    def role(self) -> HeadDriver | StageWorker | None:
        """The stage this node serves now (None: none)."""
        return self._role

    async def _open_source(self) -> ModelSource:
        """The model file, or this node's slice package from the object store, verified first."""
        if self.settings.weights_from == "disk":
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, open_model, self.settings.model)
        bundle = self.security.require()
        try:
            source = await fetch_slice_source(
                self.js,
                self.model,
                self.node_id,
                bundle.identity,
                bundle.trust,
                expect_model_revision=self.settings.model_revision,
            )
        except AuthenticationError as exc:
            self.security.reject(exc, what="slice package")
            raise ModelLoadError(
                f"the slice package for {self.node_id} was refused ({exc.reason}: {exc.detail})"
            ) from exc
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
        self.capacity.describe(heartbeat, self.source.config)
        heartbeat.security_rejections.update(self.security.rejections)
        if self._held is not None:
            heartbeat.held_layer_start, heartbeat.held_layer_end = self._held
        heartbeat.failed_steps, heartbeat.expired_steps = self.step_counts()
        if isinstance(self._role, HeadDriver):
            heartbeat.held_requests.extend(self._role.held_acks(MAX_HELD_IN_HEARTBEAT))
        if self._role is not None:
            hops = self._role.hops
            heartbeat.hop_ms_p50 = hops.percentile_ms(0.5)
            heartbeat.hop_ms_p99 = hops.percentile_ms(0.99)
            heartbeat.num_hops = hops.num_hops
        return heartbeat

    def _signed(self, heartbeat: bus_pb2.Heartbeat) -> bus_pb2.Heartbeat:
        bundle = self.security.bundle
        return sign_record(heartbeat, bundle.identity, "heartbeat") if bundle is not None else heartbeat

    def _reject_record(self, exc: AuthenticationError) -> None:
        self.security.reject(exc, what="plan")

    def step_counts(self) -> tuple[int, int]:
        """Steps this node failed, and (stage 0) steps it gave up waiting for, since it started."""
        role = self._role
        failed = self._failed_steps + (role.num_failed_steps if role is not None else 0)
        expired = self._expired_steps + (role.num_expired_steps if role is not None else 0)
        return failed, expired

    def snapshot(self) -> NodeSnapshot:
        """What this node is doing now, for /metrics and the telemetry report (`snapshot.py`)."""
        failed, expired = self.step_counts()
        capacity, role = self.capacity, self._role
        return NodeSnapshot(
            node_id=self.node_id,
            model=self.model,
            runtime=self.settings.backend,
            device=capacity.device,
            weights_format=capacity.weights_format,
            memory_limit_bytes=capacity.memory_limit_bytes,
            busy_s=self.executor.busy_s,
            failed_steps=failed,
            expired_steps=expired,
            rss_bytes=psutil.Process().memory_info().rss,
            rejections=dict(self.security.rejections),
            stage=role.stage_snapshot() if role is not None else None,
        )

    async def _heartbeat_loop(self) -> None:
        """A heartbeat every interval; also where an idle node gives freed heap back (`memory_trim`).

        The trim runs on the compute executor, behind any step already queued there, so it is
        started beside this loop and never awaited by it: a heartbeat that waited for a long step
        (a big prefill on a loaded machine, an MLX step) went out more than `node_ttl_s` late,
        and the coordinator dropped a working node from the plan (the short load test saw 9 such
        drops in 2 minutes, with 503s)."""
        subject = names.heartbeat_subject(self.node_id)
        stats_subject = names.telemetry_subject(STEP, self.node_id)
        trim, idle, window = load_malloc_trim(), IdleTrim(), StepWindow(time.monotonic())
        trimming: asyncio.Task[None] | None = None
        while True:
            with contextlib.suppress(Exception):
                await self.nc.publish(subject, encode_json(self._signed(self.heartbeat())))
            if self.settings.telemetry:
                with contextlib.suppress(Exception):  # for the telemetry service
                    await self.nc.publish(
                        stats_subject, step_report(self.snapshot(), window).model_dump_json().encode()
                    )
            if trim is not None and (trimming is None or trimming.done()):
                trimming = asyncio.create_task(self._trim_if_idle(trim, idle))
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def _trim_if_idle(self, trim: Callable[[], None], idle: IdleTrim) -> None:
        """Give freed heap back once the role's step counter has stood still. A method, so the
        loop above holds no reference to a role across its sleep: a role the node replaces (and
        its weights and KV pool) must be freed before the next one loads."""
        if self._role is None or not idle.due(self._role.num_steps, time.monotonic()):
            return
        before = psutil.Process().memory_info().rss
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, trim)
        except Exception:  # the executor shut down under it: nothing to give back
            return
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
            plan = self._plans.admit(entry.value)  # signed by a coordinator, and not a replay
            if plan is None:
                continue
            if placed_on_earlier_run(plan, self.node_id, self._started_at_ms):
                self._log.info("plan is for an earlier run of this node: waiting", plan=plan.version)
                continue
            try:
                await self._follow(plan)
            except ModelLoadError as exc:  # one line: what the node refused or could not load
                self._log.error("could not follow plan", plan=plan.version, error=str(exc))
            except Exception:
                self._log.exception("could not follow plan", plan=plan.version)

    async def _follow(self, plan: bus_pb2.Plan) -> None:
        current = self._plan
        if current is not None and plan.version < current.version:
            return
        found = node_view(plan, self.node_id)
        if found is None:
            await self._leave(plan)
            return
        view, index = found
        self._check_slice_holds(view.stages[index])
        self._plan = plan
        if self._serves(view, index):
            await self._drop_next()  # the pipeline is unchanged: keep serving it
            self._stage_index = index
        elif self._next is not None and self._next.index == index and same_assignment(self._next.view, view):
            if view.state == ACTIVE:  # loaded beside the old stage: switch now that it is active
                await self._switch()
        else:
            await self._drop_next()
            if self._serves_on(plan) and self._room_beside(view, index):
                await self._prepare(view, index)
                if view.state == ACTIVE:
                    await self._switch()
            else:
                await self._stop_role()
                self._stage_index = index
                await self._start_role(view)
        if isinstance(self._role, HeadDriver):  # which routed requests it must also serve
            active = {p.id for p in pipelines(plan) if p.active}
            self._role.routes.follow(active, drains=bool(active) and pipeline_id(view) == min(active))
        if view.state == ACTIVE and isinstance(self._role, HeadDriver) and not self._head_started:
            self._head_started = True
            await self._role.start()

    def _check_slice_holds(self, placement: bus_pb2.PlanStage) -> None:
        """A node serving from a slice package refuses (counted) a stage its verified manifest does
        not hold, before it stops or loads anything."""
        source = self.source
        if not isinstance(source, SliceSource):
            return
        try:
            source.check_holds(placement.start, placement.end)
        except AuthenticationError as exc:
            self.security.reject(exc, what="plan stage")
            raise ModelLoadError(
                f"the plan asks {self.node_id} for layers [{placement.start}, {placement.end}), "
                f"which its slice package does not hold ({exc.detail}): stage refused"
            ) from exc

    def _serves(self, view: bus_pb2.Plan, index: int) -> bool:
        """Whether the running role already is stage `index` of `view` (its state aside)."""
        role = self._role
        if role is None:
            return False
        return role.stage_index == index and same_assignment(role.plan, view)

    async def _leave(self, plan: bus_pb2.Plan) -> None:
        """The plan leaves this node out (a spare, or gone): stop serving, free the memory. While
        no pipeline of the plan is active yet, the old stage goes on serving (make before break)."""
        await self._drop_next()
        self._plan, self._stage_index = plan, -1
        new_is_active = any(p.active for p in pipelines(plan))
        if self._serves_on(plan) and not new_is_active:
            self._log.info(
                "not in plan: serving the old stage until the new plan is active", plan=plan.version
            )
            return
        await self._stop_role()
        self._backend = None
        self._log.info("not in plan", plan=plan.version, spare=self.node_id in plan.spares)

    def _serves_on(self, plan: bus_pb2.Plan) -> bool:
        """Whether the running stage can go on serving while `plan` loads: make before break is
        on, and every node of its pipeline still lives (the new plan names it somewhere). A
        pipeline that lost a node cannot serve, so its survivors free their memory first."""
        role = self._role
        if role is None or not self.settings.make_before_break:
            return False
        alive = {s.node_id for s in plan.stages} | set(plan.spares) | set(plan.quarantined)
        return all(s.node_id in alive for s in role.plan.stages)

    async def _prepare(self, view: bus_pb2.Plan, index: int) -> None:
        """Load stage `index` of `view` beside the running stage (`handover`), and report it loaded."""
        self._stage_index, self._loaded = index, False
        placement = view.stages[index]
        serving = self._backend
        shared = (
            serving
            if serving is not None and (serving.start, serving.end) == (placement.start, placement.end)
            else None
        )
        # MLX arrays belong to the thread that made them: an MLX node loads where it computes
        executor = self.executor if self.settings.backend == "mlx" else self.loader
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        stage, backend = await loop.run_in_executor(
            executor, self._load_beside, placement.start, placement.end, view, shared
        )
        role = make_role(self, view, index, stage)
        if isinstance(role, StageWorker):
            await role.start()  # subscribed before the new stage 0 sends its first frame
        self._next = NextRole(view, index, backend, role)
        self._loaded = True
        self._log.info(
            "next stage loaded while serving",
            plan=view.version,
            stage=index,
            layers=f"[{placement.start}, {placement.end})",
            shared_weights=shared is not None,
            load_s=round(time.monotonic() - started, 2),
        )

    async def _switch(self) -> None:
        """The new pipeline is active: stop the old role (stage 0 hands its requests back to the
        stream) and serve the stage loaded beside it."""
        upcoming, self._next = self._next, None
        assert upcoming is not None
        await self._stop_role()
        self._role, self._backend, self._loaded = upcoming.role, upcoming.backend, True
        self._log.info("switched to the next stage", plan=upcoming.view.version, stage=upcoming.index)

    async def _drop_next(self) -> None:
        upcoming, self._next = self._next, None
        if upcoming is not None and isinstance(upcoming.role, StageWorker):
            await upcoming.role.stop()

    def _room_beside(self, view: bus_pb2.Plan, index: int) -> bool:
        """Whether stage `index` of `view` fits beside the running stage (else: break first)."""
        serving, role = self._backend, self._role
        if serving is None or role is None:
            return False
        placement = view.stages[index]
        shared = (serving.start, serving.end) == (placement.start, placement.end)
        held = serving_footprint(self.capacity, serving, role.plan)
        upcoming = stage_footprint(self.capacity, view, index, shared_weights=shared)
        if room_for_both(self.capacity, held, upcoming):
            return True
        self._log.info(
            "no room to load the next stage beside this one: stopping this one first",
            serving_mb=held.total >> 20,
            next_mb=upcoming.total >> 20,
            memory_limit_mb=self.capacity.memory_limit_bytes >> 20,
        )
        return False

    async def _start_role(self, plan: bus_pb2.Plan) -> None:
        placement = plan.stages[self._stage_index]
        loop = asyncio.get_running_loop()
        stage, backend = await loop.run_in_executor(
            self.executor, self._load, placement.start, placement.end, plan
        )
        self._role = make_role(self, plan, self._stage_index, stage)
        self._head_started = False
        if isinstance(self._role, StageWorker):
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
            backend = self._make_backend(start, end)
        backend.allocate_kv_cache(plan.num_kv_blocks, plan.block_size)
        self._backend = backend
        return Stage(backend, plan.block_size, len(model_kv_groups(self.source.config))), backend

    def _load_beside(
        self, start: int, end: int, plan: bus_pb2.Plan, shared: Backend | None
    ) -> tuple[Stage, Backend]:
        """A stage loaded while the running one keeps its weights and KV pool (`handover`)."""
        backend = share_weights(shared) if shared is not None else self._make_backend(start, end)
        backend.allocate_kv_cache(plan.num_kv_blocks, plan.block_size)
        return Stage(backend, plan.block_size, len(model_kv_groups(self.source.config))), backend

    def _make_backend(self, start: int, end: int) -> Backend:
        s = self.settings
        return make_backend(
            s.backend,
            self.source,
            start,
            end,
            device=s.device,
            dtype=s.dtype,
            weights=s.weights,
            kv_cache_dtype=s.kv_cache_dtype,
            batch_invariant=s.batch_invariant,
        )

    async def _stop_role(self) -> None:
        self._failed_steps, self._expired_steps = self.step_counts()
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
