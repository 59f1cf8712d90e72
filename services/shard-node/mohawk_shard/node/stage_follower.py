"""A shard node's stage through plan changes: carry out what `stage_plan.decide` says of each plan,
with one way to load a stage (`load_stage`) and one to stop it.

Design. The follower holds what the node serves: the running role (its stage of a pipeline) and,
during a make-before-break handover, the role loaded beside it (`NextRole`), each with its backend
(weights and KV pool) and whether it was started. A stage 1+ worker starts as soon as it is
loaded, subscribed before the new stage 0 sends its first frame; stage 0 waits for its pipeline to
be active (`Role.waits_for_active`) before it pulls requests. `load_stage` loads a layer range with
the pipeline's KV block count, beside the running stage or in its place: in its place it reuses
the weights it holds when the range is unchanged, and lets the old ones go first otherwise;
beside it it shares them (`share_weights`) or loads a second copy on the loader thread (an MLX
node loads where it computes: MLX arrays belong to the thread that made them). A backend let go is
freed then and there, before a new one loads (`free_now`): a stopped role's objects refer to each
other (its tasks call back into it), so without a collection its weights and KV pool waited for
the cycle collector, and a survivor of a killed node held its old pool beside the new one (2.6 GB
against 1.5 when CI measured it). What the heartbeat reports of the plan (`following`): the
version it follows, the stage it was given, whether it is loaded; a stage just loaded asks for the
next heartbeat at once (`beat_now`), since the coordinator activates a plan when every stage
reports it loaded (waiting for the interval left a failover's pipeline idle up to a second).
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

import structlog

from mohawk_common.bus.pipelines import pipelines
from mohawk_common.errors import ModelLoadError
from mohawk_common.kv_groups import model_kv_groups
from mohawk_common.model_store.slice_source import SliceSource
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.backends import backend_from_settings
from mohawk_shard.backends.stacked import StackedBackend, parts_of
from mohawk_shard.engine.backend import Backend
from mohawk_shard.engine.kv_carry import Carry
from mohawk_shard.engine.stage import Stage
from mohawk_shard.node.capacity import Capacity
from mohawk_shard.node.handover import room_for_both, serving_footprint, share_weights, stage_footprint
from mohawk_shard.node.pipeline_view import view_of
from mohawk_shard.node.roles import Role, RoleHost, make_role
from mohawk_shard.node.snapshot import Following
from mohawk_shard.node.stage_plan import Action, StageAssignment, decide
from mohawk_shard.node.standby import MirrorSwitch, WarmStandby, asked_of, mirrors_to_next

log = structlog.get_logger("mohawk.shard")


def free_now(gone: weakref.ref[Backend], *, held: tuple[Backend | None, ...]) -> None:
    """Free the backend `gone` refers to, unless one of `held` is it: once nothing but reference
    cycles keep it, a collection frees its weights and KV pool now rather than whenever the cycle
    collector next reaches its generation."""
    backend = gone()
    if backend is None or any(backend is other for other in held):
        return
    del backend
    gc.collect()
    if gone() is not None:
        log.warning("a stage let go is still referenced: its memory stays held")


class FollowerHost(RoleHost, Protocol):
    """What following the plan reads of the node (`ShardNode` is one)."""

    @property
    def capacity(self) -> Capacity: ...

    @property
    def loader(self) -> Executor: ...

    @property
    def started_at_ms(self) -> int: ...

    def beat_now(self) -> None: ...

    def cores_anew(self) -> None: ...


@dataclass(slots=True)
class Serving:
    """A role the node holds, with its backend, and whether it was started."""

    role: Role
    backend: Backend
    started: bool = False

    @property
    def placement(self) -> StageAssignment:
        return StageAssignment(self.role.view, self.role.stage_index)


class StageFollower:
    def __init__(self, host: FollowerHost) -> None:
        self.host = host
        self._log = log.bind(node_id=host.node_id)
        self.plan: bus_pb2.Plan | None = None  # the whole plan last followed
        self.stage_index = -1
        self.loaded = False
        self.took_standby = False  # the last stage loaded was the standby's weights
        self.widened = False  # the last stage loaded is the running one's weights and layers loaded beside
        self.current: Serving | None = None
        self.next: Serving | None = None  # loaded beside the running stage, until its pipeline is active
        self._backend: Backend | None = None  # the running stage's (None once it is let go)
        self.carry = Carry()  # what the stage last stopped held of each request, for the next
        self._failed_steps = 0  # of roles already stopped
        self._expired_steps = 0
        mlx = host.settings.backend == "mlx"  # loads where it computes
        self.mirrors = MirrorSwitch(host.node_id)
        self.standby = WarmStandby(
            host.node_id, self._make_backend, host.executor if mlx else None, host.beat_soon, self._free
        )

    @property
    def role(self) -> Role | None:
        return self.current.role if self.current is not None else None

    def following(self) -> Following:
        version = self.plan.version if self.plan is not None and self.stage_index >= 0 else 0
        return Following(version, self.stage_index, self.loaded, self.standby.held)

    def step_counts(self) -> tuple[int, int]:
        """Steps this node failed, and (stage 0) steps it gave up waiting for, since it started."""
        role = self.role
        failed = self._failed_steps + (role.num_failed_steps if role is not None else 0)
        expired = self._expired_steps + (role.num_expired_steps if role is not None else 0)
        return failed, expired

    async def follow(self, plan: bus_pb2.Plan) -> None:
        """Serve what `plan` asks of this node (a plan older than the one followed is ignored)."""
        if self.plan is not None and plan.version < self.plan.version:
            return
        await self._follow(plan)
        self._mirror_as(plan)

    def _mirror_as(self, plan: bus_pb2.Plan) -> None:
        """Each stage held mirrors its KV to the next stage's node where `plan` asks that node to
        hold its layers on standby (`kv_mirror`), from `SETTLE_S` after the plan asks."""
        settings = self.host.settings
        for serving in (self.current, self.next):
            stage = serving.role.compute.stage if serving is not None else None
            if stage is None or serving is None:
                continue
            wanted = settings.kv_carry and settings.kv_mirror
            self.mirrors.set(
                stage, wanted and mirrors_to_next(plan, serving.role.view, serving.role.stage_index)
            )

    async def _follow(self, plan: bus_pb2.Plan) -> None:
        found = view_of(plan, self.host.node_id)
        asked = StageAssignment(*found) if found is not None else None
        if asked is not None:
            self.check_slice_holds(asked.view.stages[asked.index])
        decision = decide(
            plan,
            asked,
            serving=self.current.placement if self.current is not None else None,
            upcoming=self.next.placement if self.next is not None else None,
            make_before_break=self.host.settings.make_before_break,
        )
        if decision.action not in (Action.SWITCH, Action.WAIT):
            await self.drop_next()
        self.plan = plan
        if asked is None:
            await self._leave(plan, decision.action)
            self._follow_standby(plan)
            return
        if decision.action == Action.KEEP:
            self.stage_index = asked.index
        elif decision.action == Action.SWITCH:
            await self._switch()
        elif decision.action == Action.LOAD and decision.serve_on and self._room_beside(asked):
            await self.load_stage(asked, beside=True)
            if decision.is_active:
                await self._switch()
        elif decision.action == Action.LOAD:
            await self.stop_role()
            await self.load_stage(asked, beside=False)
        current = self.current
        if current is not None:  # which routed requests it must also serve (stage 0)
            active = {p.id for p in pipelines(plan) if p.active}
            current.role.follow_pipelines(active, drains=bool(active) and asked.view.pipeline == min(active))
            if decision.is_active and not current.started:
                current.started = True
                await current.role.start()
        if decision.is_active:  # a standby loads once the node's pipeline serves, never during a failover
            self._follow_standby(plan)

    def _follow_standby(self, plan: bus_pb2.Plan) -> None:
        self.standby.follow(asked_of(plan, self.host.node_id, self.host.started_at_ms))

    def check_slice_holds(self, placement: bus_pb2.PlanStage) -> None:
        """A node serving from a slice package refuses (counted) a stage its verified manifest does
        not hold, before it stops or loads anything."""
        source = self.host.source
        if not isinstance(source, SliceSource):
            return
        try:
            source.check_holds(placement.start, placement.end)
        except AuthenticationError as exc:
            self.host.security.reject(exc, what="plan stage")
            raise ModelLoadError(
                f"the plan asks {self.host.node_id} for layers [{placement.start}, {placement.end}), "
                f"which its slice package does not hold ({exc.detail}): stage refused"
            ) from exc

    async def _leave(self, plan: bus_pb2.Plan, action: Action) -> None:
        """The plan leaves this node out (a spare, or gone): stop serving, free the memory. While
        no pipeline of the plan is active yet, the old stage goes on serving (make before break)."""
        self.stage_index = -1
        if action == Action.SERVE_ON:
            self._log.info(
                "not in plan: serving the old stage until the new plan is active", plan=plan.version
            )
            return
        gone = self._backend_ref()
        await self.stop_role()
        self._backend, self.carry = None, Carry()
        self._free(gone)
        self._log.info("not in plan", plan=plan.version, spare=self.host.node_id in plan.spares)

    async def load_stage(self, asked: StageAssignment, *, beside: bool) -> None:
        """Load stage `asked.index` of `asked.view` beside the running stage (`handover`; it serves
        on until the new pipeline is active) or in its place, and report it loaded."""
        view, index = asked.view, asked.index
        placement = view.stages[index]
        self.stage_index, self.loaded, self.took_standby, self.widened = index, False, False, False
        held = self._backend  # not kept past this line: the old stage must go before the new loads
        reuse = held is not None and (held.start, held.end) == (placement.start, placement.end)
        del held
        # MLX arrays belong to the thread that made them: an MLX node loads where it computes
        executor = self.host.loader if beside and self.host.settings.backend != "mlx" else self.host.executor
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        stage, backend = await loop.run_in_executor(executor, self._load, asked, beside)
        serving = Serving(make_role(self.host, view, index, stage), backend)
        if not serving.role.waits_for_active:  # subscribed before the new stage 0 sends its first frame
            await serving.role.start()
            serving.started = True
        if beside:
            self.next = serving
        else:
            self.current, self._backend = serving, backend
        self.loaded = True
        self.host.cores_anew()
        self.host.beat_now()
        self._log.info(
            "next stage loaded while serving" if beside else "stage loaded",
            epoch=view.epoch,
            pipeline=view.pipeline,
            stage=index,
            layers=f"[{placement.start}, {placement.end})",
            shared_weights=beside and reuse,
            kept_weights=reuse,
            from_standby=self.took_standby,
            widened=self.widened,
            weight_mb=round(backend.weight_bytes / 2**20, 1),
            num_kv_blocks=view.num_kv_blocks,
            load_s=round(time.monotonic() - started, 2),
        )

    def _load(self, asked: StageAssignment, beside: bool) -> tuple[Stage, Backend]:
        """On the load thread: the stage's backend, with the pipeline's KV pool allocated."""
        view, placement = asked.view, asked.view.stages[asked.index]
        start, end = placement.start, placement.end
        held = self._backend
        if held is not None and (held.start, held.end) == (start, end):
            backend = share_weights(held) if beside else held
        elif (warm := self.standby.take(start, end, held, beside)) is not None:
            backend, self.took_standby = warm, True
            del held
        elif held is not None and start <= held.start and held.end <= end:
            backend, self.widened = self._widen(share_weights(held) if beside else held, start, end), True
            del held
        else:
            del held
            if not beside:  # let the old weights and KV pool go before the new ones load
                gone, self._backend = self._backend_ref(), None
                self._free(gone)
            backend = self._make_backend(start, end)
        backend.allocate_kv_cache(view.num_kv_blocks, view.block_size)
        if not beside:
            self._backend = backend
        groups = len(model_kv_groups(self.host.source.config))
        # with kv_carry, a stage that sends rows on keeps them beside its KV, for its successor
        num_blocks = view.num_kv_blocks if self.host.settings.kv_carry else None
        mirror_max_bytes = self.host.settings.kv_mirror_max_mb << 20
        stage = Stage(
            backend, view.block_size, groups, num_blocks=num_blocks, mirror_max_bytes=mirror_max_bytes
        )
        self._hand_carry(stage)
        return stage, backend

    def _hand_carry(self, stage: Stage) -> None:
        """Give `stage` what the stage this node stopped held of each request (its layer ranges
        that `stage` runs again are not computed again for them)."""
        carry, self.carry = self.carry, Carry()
        if len(carry):
            stage.adopt(carry)

    def _widen(self, held: Backend, start: int, end: int) -> Backend:
        """Layers [start, end) as the running stage's weights with the layers either side of them
        loaded: a re-plan that widens this node's stage loads only what it lacks, and the KV it
        carries serves the layers it kept (`kv_carry`)."""
        before = [self._make_backend(start, held.start)] if start < held.start else []
        after = [self._make_backend(held.end, end)] if held.end < end else []
        return StackedBackend([*before, held, *after])

    def _make_backend(self, start: int, end: int) -> Backend:
        s = self.host.settings
        return backend_from_settings(s.backend, s, self.host.source, start, end)

    def _room_beside(self, asked: StageAssignment) -> bool:
        """Whether stage `asked.index` of `asked.view` fits beside the running stage (else: break first)."""
        serving, current = self._backend, self.current
        if serving is None or current is None:
            return False
        placement = asked.view.stages[asked.index]
        shared = (serving.start, serving.end) == (placement.start, placement.end)
        held = serving_footprint(self.host.capacity, serving, current.role.view)
        upcoming = stage_footprint(self.host.capacity, asked.view, asked.index, shared_weights=shared)
        if room_for_both(self.host.capacity, held, upcoming):
            return True
        self._log.info(
            "no room to load the next stage beside this one: stopping this one first",
            serving_mb=held.total >> 20,
            next_mb=upcoming.total >> 20,
            memory_limit_mb=self.host.capacity.memory_limit_bytes >> 20,
        )
        return False

    async def _switch(self) -> None:
        """The new pipeline is active: stop the old role (stage 0 hands its requests back to the
        stream) and serve the stage loaded beside it."""
        upcoming, self.next = self.next, None
        if upcoming is None:
            return
        gone = self._backend_ref()
        await self.stop_role()
        self.current, self._backend, self.loaded = upcoming, upcoming.backend, True
        stage = upcoming.role.compute.stage
        if stage is not None:
            self._hand_carry(stage)
        self._free(gone)
        self._log.info(
            "switched to the next stage", epoch=upcoming.role.view.epoch, stage=upcoming.role.stage_index
        )

    async def drop_next(self) -> None:
        """Let the stage loaded beside go (the plan no longer asks for it)."""
        upcoming, self.next = self.next, None
        if upcoming is None:
            return
        if upcoming.started:
            await upcoming.role.stop()
        gone = weakref.ref(upcoming.backend)
        del upcoming
        self._free(gone)

    def _backend_ref(self) -> weakref.ref[Backend] | None:
        return weakref.ref(self._backend) if self._backend is not None else None

    def _free(self, gone: weakref.ref[Backend] | None) -> None:
        """`free_now` for a backend this node no longer serves (kept if it serves it still)."""
        if gone is not None:
            held = (
                *parts_of(self._backend),
                *parts_of(self.next.backend if self.next is not None else None),
                *parts_of(self.standby.backend),
            )
            free_now(gone, held=held)

    async def stop_role(self) -> None:
        """Stop the running role (stage 0 hands its unfinished requests back to the stream) and
        keep what its stage held of each request for the next stage this node serves (`carry`)."""
        self._failed_steps, self._expired_steps = self.step_counts()
        current, self.current = self.current, None
        self.loaded = False
        if current is None:
            return
        stage = current.role.compute.stage
        if current.started:
            await current.role.stop()
        if stage is not None and stage.carries_kv and self.host.settings.kv_carry:
            # on the compute thread, after any step still running there
            loop = asyncio.get_running_loop()
            self.carry.merge(await loop.run_in_executor(self.host.executor, stage.export_carry))
            # mirrored: requests whose KV of the stage before (this node's standby's layers) it held
            self._log.info(
                "kv kept for the next stage", requests=len(self.carry), mirrored=stage.num_mirrored
            )
