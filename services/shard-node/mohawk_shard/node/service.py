"""A shard node's life: connect, measure itself, heartbeat, follow the plan, serve whatever stage it holds.

Design. This module is the node's process wrapper: it connects to the bus, measures what the node
offers (`capacity.py`), and runs three loops. Every interval it takes one snapshot of itself
(`NodeSnapshot`), from which it builds its heartbeat (`heartbeat.py`: what it offers the planner,
which plan and stage it follows) and its telemetry report, and where an idle node gives freed heap
back; /metrics reads the same snapshot. It watches the plan key and hands each signed plan that is
new to it (`PlanFollower`) to its `StageFollower`, which decides what the plan asks of this node
(`stage_plan.py`: keep its stage, load another, beside the running one where it can, switch, or
leave) and loads and serves that stage. And it follows certificate revocations. A stage 0 that
takes requests off the stream asks for the next heartbeat at once (`beat_soon`, at most one per
`EARLY_BEAT_S`): the heartbeat lists the requests it holds, which the coordinator hands back to the
stream the moment the node leaves, so the list must not be up to an interval old (a stage 0 killed
right after taking requests left them to wait out the ack wait, 10 s). A stage just loaded asks
for it now (`beat_now`), without that wait: the coordinator activates a plan when every stage
reports it loaded, so in a failover those 50 ms were the whole pipeline's. Only the heartbeat goes
out early: the telemetry report and the idle trim keep the interval.
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
from mohawk_common.bus.control import encode_json
from mohawk_common.bus.control_records import RecordVerifier, sign_record
from mohawk_common.bus.plan_follower import PlanFollower, placed_on_earlier_run
from mohawk_common.bus.security import Security
from mohawk_common.bus.setup import ensure_buckets, ensure_streams
from mohawk_common.bus.telemetry_records import seal_report
from mohawk_common.errors import ModelLoadError
from mohawk_common.long_lived import freeze_long_lived
from mohawk_common.memory_trim import IdleTrim, load_malloc_trim
from mohawk_common.metrics_port import serve_metrics
from mohawk_common.model_store import ModelSource, open_model
from mohawk_common.model_store.slice_fetch import fetch_slice_source
from mohawk_common.tasks import cancel_and_wait
from mohawk_common.telemetry import STEP
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.model.load_progress import MEASURED_EVENT
from mohawk_shard.node.capacity import Capacity, measure_capacity
from mohawk_shard.node.config import NodeSettings
from mohawk_shard.node.heartbeat import build_heartbeat
from mohawk_shard.node.host_cores import HostCores
from mohawk_shard.node.metrics import node_metrics
from mohawk_shard.node.roles import Role
from mohawk_shard.node.slice_high_water import SliceHighWater
from mohawk_shard.node.snapshot import NodeSnapshot
from mohawk_shard.node.stage_follower import StageFollower
from mohawk_shard.node.step_stats import StepWindow, TimedExecutor, step_report

log = structlog.get_logger("mohawk.shard")
EARLY_BEAT_S = 0.05  # a heartbeat asked for early waits this long for the rest of a burst


class ShardNode:
    def __init__(self, settings: NodeSettings, security: Security) -> None:
        self.settings = settings
        self.security = security
        self.node_id = names.check_id("node id", settings.node_id)
        self.served_model = served_model_name(settings.model, settings.served_model_name)
        self.executor = TimedExecutor(max_workers=1, thread_name_prefix="mohawk-compute")
        self.loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mohawk-load")  # handover
        self._log = log.bind(node_id=self.node_id)
        self._started_at_ms = int(time.time() * 1000)
        self._stop = asyncio.Event()
        self._beat_soon = asyncio.Event()
        self._beat_now = asyncio.Event()
        self._held: tuple[int, int] | None = None
        self._alone: Callable[[Callable[[], float]], float] | None = None  # HostCores.undisturbed
        self._cores: HostCores | None = None
        self.stages = StageFollower(self)
        bundle = security.bundle
        verifier = RecordVerifier(bundle.trust if bundle is not None else None)
        self._plans = PlanFollower(self.served_model, verifier, self._reject_record)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        if self.settings.num_threads is not None or self.settings.host_cores_file is not None:
            import torch

            if self.settings.num_threads is not None:
                torch.set_num_threads(self.settings.num_threads)
            if self.settings.host_cores_file is not None and self.settings.backend == "torch":
                cores = HostCores(
                    self.settings.host_cores_file, torch.get_num_threads(), torch.set_num_threads
                )
                self.executor.around = cores.turn
                self._alone = cores.undisturbed
                self._cores = cores
        self.nc: Client = await connect(
            self.settings.nats_servers,
            name=f"shard-{self.node_id}",
            creds=self.settings.bus_creds(self.node_id),
            tls_ca=self.settings.nats_tls_ca,
        )
        self.js = self.nc.jetstream()
        self.source = await self._open_source()
        self.tokenizer = await loop.run_in_executor(self.executor, self.source.load_decoder)
        self.capacity: Capacity = await loop.run_in_executor(self.executor, self._measure)
        self._log.info(
            MEASURED_EVENT,
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
        frozen = freeze_long_lived()  # full collections no longer walk the imports and tokenizer
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        watcher = asyncio.create_task(self._watch_plan())
        revocations = asyncio.create_task(self.security.follow_revocations(self.buckets.pki))
        secure = self.security.secure
        self._log.info(
            "node up",
            model=self.served_model,
            nats=self.settings.nats_url,
            secure=secure,
            frozen_objects=frozen,
        )
        await self._stop.wait()
        await cancel_and_wait(heartbeat, watcher, revocations)
        await self.stages.drop_next()
        await self.stages.stop_role()
        self.stages.standby.close()
        with contextlib.suppress(Exception):
            await self.nc.drain()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.loader.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        self._stop.set()

    @property
    def role(self) -> Role | None:
        """The stage this node serves now (None: none)."""
        return self.stages.role

    async def _open_source(self) -> ModelSource:
        """The model file, or this node's slice package from the object store, verified first."""
        if self.settings.weights_from == "disk":
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, open_model, self.settings.model)
        bundle = self.security.require()
        marks = SliceHighWater(self.settings.state_path)
        try:
            source = await fetch_slice_source(
                self.js,
                self.served_model,
                self.node_id,
                bundle.identity,
                bundle.trust,
                expect_model_revision=self.settings.model_revision,
            )
            marks.check(self.served_model, source.manifest)  # never older than what it loaded before
            marks.accept(self.served_model, source.manifest)
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
            alone=self._alone,
        )

    # -- heartbeat -------------------------------------------------------------------------------

    def heartbeat(self, snapshot: NodeSnapshot | None = None) -> bus_pb2.Heartbeat:
        """The heartbeat of this node now, or of `snapshot` (taken this tick)."""
        return build_heartbeat(
            snapshot if snapshot is not None else self.snapshot(),
            self.capacity,
            self.source.config,
            started_at_ms=self._started_at_ms,
            held_layers=self._held,
            insecure=not self.security.secure,
        )

    def _signed(self, heartbeat: bus_pb2.Heartbeat) -> bus_pb2.Heartbeat:
        bundle = self.security.bundle
        return sign_record(heartbeat, bundle.identity, "heartbeat") if bundle is not None else heartbeat

    def _reject_record(self, exc: AuthenticationError) -> None:
        self.security.reject(exc, what="plan")

    def snapshot(self) -> NodeSnapshot:
        """What this node is doing now, for /metrics and the telemetry report (`snapshot.py`)."""
        failed, expired = self.stages.step_counts()
        capacity, role = self.capacity, self.stages.role
        return NodeSnapshot(
            node_id=self.node_id,
            model=self.served_model,
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
            following=self.stages.following(),
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
        sequence = 0
        trimming: asyncio.Task[None] | None = None
        interval_due = 0.0  # the report and the idle trim keep the interval; early beats skip them
        while True:
            snapshot = self.snapshot()  # one per tick: the heartbeat and the report read it
            with contextlib.suppress(Exception):
                heartbeat = self.heartbeat(snapshot)
                heartbeat.sequence = sequence = sequence + 1  # with sent_at: readers refuse replays
                await self.nc.publish(subject, encode_json(self._signed(heartbeat)))
            now = time.monotonic()
            if now >= interval_due:
                interval_due = now + self.settings.heartbeat_interval_s
                if self.settings.telemetry:
                    with contextlib.suppress(Exception):  # for the telemetry service, signed as heartbeats
                        report = step_report(snapshot, window).model_dump_json()
                        bundle = self.security.bundle
                        identity = bundle.identity if bundle is not None else None
                        sealed = seal_report(STEP, self.node_id, report, identity)
                        await self.nc.publish(stats_subject, sealed)
                if trim is not None and (trimming is None or trimming.done()):
                    trimming = asyncio.create_task(self._trim_if_idle(trim, idle))
            with contextlib.suppress(TimeoutError):  # not wait_for: 3.11 may swallow a cancel
                async with asyncio.timeout(self.settings.heartbeat_interval_s):
                    await self._beat_soon.wait()
                async with asyncio.timeout(EARLY_BEAT_S):  # the rest of a burst of requests, in one heartbeat
                    await self._beat_now.wait()
            self._beat_soon.clear()
            self._beat_now.clear()

    @property
    def started_at_ms(self) -> int:
        """This run of the node (its heartbeats' started_at_ms), which plans place stages on."""
        return self._started_at_ms

    def beat_soon(self) -> None:
        """Send the next heartbeat now rather than at the interval (what stage 0 holds changed)."""
        self._beat_soon.set()

    def cores_anew(self) -> None:
        """A stage was loaded: the turns this node met on the host's cores before are no guide
        (`HostCores.forget`)."""
        if self._cores is not None:
            self._cores.forget()

    def beat_now(self) -> None:
        """Send the next heartbeat now, without waiting `EARLY_BEAT_S` for more news: a stage just
        loaded, which the coordinator waits for to activate the plan (a failover's pipeline idles
        until it hears it)."""
        self._beat_soon.set()
        self._beat_now.set()

    async def _trim_if_idle(self, trim: Callable[[], None], idle: IdleTrim) -> None:
        """Give freed heap back once the role's step counter has stood still. A method, so the
        loop above holds no reference to a role across its sleep: a role the node replaces (and
        its weights and KV pool) must be freed before the next one loads."""
        role = self.stages.role
        if role is None or not idle.due(role.num_steps, time.monotonic()):
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
                await self.stages.follow(plan)
            except ModelLoadError as exc:  # one line: what the node refused or could not load
                self._log.error("could not follow plan", plan=plan.version, error=str(exc))
            except Exception:
                self._log.exception("could not follow plan", plan=plan.version)
