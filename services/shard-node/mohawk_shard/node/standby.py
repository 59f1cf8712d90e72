"""A shard node's warm standby: the layer range the plan asks it to hold loaded beside its stage,
so that a failover hands it that range with nothing to load.

Design. The plan's `standbys` (the coordinator's `standbys.py`) name the node, its run and a
range. The node loads the range's weights and no KV pool on a thread of its own, in the
background: a plan that arrives meanwhile, a failover's among them, is followed at once (a failover
that needs the range before it is loaded loads it the ordinary way). The heartbeat reports the range
once it is held, and only then does the coordinator re-plan onto it. When a plan gives the node the
range as its stage, or its own stage widened by it, `take` hands over the held weights (widened:
its own backend and the standby stacked, `StackedBackend`) and the stage allocates its KV pool. A
range the plan no longer asks for is let go. A load starts `SETTLE_S` after the plan asked for it
(the follower asks once the node's pipeline is active, so never during a failover's load), and
its thread runs at the lowest priority, so it takes only the CPU that serving leaves: the plan
after a failover asks the survivors for new standbys at once, and their loads, though niced,
slowed the resume beside them (the 135M chaos kill: 255-291 ms from serving to caught up with the
loads beside it, 225-247 ms with them 3 s later, three runs each), and a 1.7B-shaped file's
takes 2-3 s. An MLX node loads where it computes (its arrays belong to the thread that made them).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor

import structlog

from mohawk_proto.v1 import bus_pb2
from mohawk_shard.backends.stacked import StackedBackend
from mohawk_shard.engine.backend import Backend
from mohawk_shard.engine.stage import Stage
from mohawk_shard.kernels.pool_residency import lowest_priority
from mohawk_shard.node.handover import share_weights
from mohawk_shard.node.pipeline_view import PipelineView

log = structlog.get_logger("mohawk.shard")

Range = tuple[int, int]
NONE: Range = (0, 0)


SETTLE_S = 5.0  # a standby starts loading this long after the plan asks: a failover's resume first


def asked_of(plan: bus_pb2.Plan, node_id: str, started_at_ms: int) -> Range:
    """The range `plan` asks this node's run to hold warm (NONE: none)."""
    for standby in plan.standbys:
        if standby.node_id == node_id and standby.node_started_at_ms in (0, started_at_ms):
            return standby.start, standby.end
    return NONE


def mirrors_to_next(plan: bus_pb2.Plan, view: PipelineView, index: int) -> bool:
    """Whether `plan` asks the next stage's node of `view` to hold stage `index`'s layers on standby
    (the stage then mirrors its KV there: `engine/kv_mirror.py`)."""
    if index + 1 >= len(view.stages):
        return False
    own, after = view.stages[index], view.stages[index + 1]
    return any(
        (sb.node_id, sb.covers, sb.start, sb.end) == (after.node_id, own.node_id, own.start, own.end)
        and sb.pipeline == own.pipeline
        for sb in plan.standbys
    )


class MirrorSwitch:
    """Turns a stage's KV mirroring (`Stage.mirror_kv`) on `settle_s` after a plan asks for it and
    off at once. A plan after a failover asks at once for the new standbys, which load `SETTLE_S`
    later: mirroring meanwhile would copy every resumed request's KV from position 0 (22 MB a step
    for 8 streams of the 1.7B) beside the catch-up, for a holder that cannot use it yet."""

    def __init__(self, node_id: str, settle_s: float = SETTLE_S) -> None:
        self._log = log.bind(node_id=node_id)
        self.settle_s = settle_s
        self._pending: weakref.WeakKeyDictionary[Stage, asyncio.TimerHandle] = weakref.WeakKeyDictionary()

    def set(self, stage: Stage, on: bool) -> None:
        if not on:
            pending = self._pending.pop(stage, None)
            if pending is not None:
                pending.cancel()
            if stage.mirror_kv:
                stage.mirror_kv = False
                self._log.info("kv not mirrored")
            return
        if stage.mirror_kv or stage in self._pending:
            return
        if self.settle_s <= 0:
            self._turn_on(weakref.ref(stage))
            return
        loop = asyncio.get_running_loop()
        self._pending[stage] = loop.call_later(self.settle_s, self._turn_on, weakref.ref(stage))

    def _turn_on(self, ref: weakref.ref[Stage]) -> None:
        stage = ref()
        if stage is None:
            return
        self._pending.pop(stage, None)
        stage.mirror_kv = True
        if stage.mirror_kv:
            self._log.info("kv mirrored to the next stage's standby")


class WarmStandby:
    """The standby range a node holds (`held`), loading and letting go as plans ask."""

    def __init__(
        self,
        node_id: str,
        make_backend: Callable[[int, int], Backend],
        loader: Executor | None,
        beat_soon: Callable[[], None],
        free: Callable[[weakref.ref[Backend]], None],
        settle_s: float = SETTLE_S,
    ) -> None:
        self._log = log.bind(node_id=node_id)
        self.settle_s = settle_s
        self._make_backend = make_backend
        self._own_loader = loader is None
        self._loader = loader or ThreadPoolExecutor(
            1, thread_name_prefix="standby", initializer=lowest_priority
        )
        self._beat_soon = beat_soon
        self._free = free
        self.backend: Backend | None = None
        self._wanted = NONE
        self._loading: asyncio.Task[None] | None = None

    @property
    def held(self) -> Range:
        return (self.backend.start, self.backend.end) if self.backend is not None else NONE

    def follow(self, wanted: Range) -> None:
        """Hold `wanted` (NONE: nothing): let another range go, load this one in the background."""
        self._wanted = wanted
        if self.backend is not None and self.held != wanted:
            self.let_go()
        if wanted != NONE and self.backend is None and self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load(wanted))

    async def _load(self, wanted: Range) -> None:
        started, backend = 0.0, None
        try:
            await asyncio.sleep(self.settle_s)  # a failover's resume has the CPU to itself first
            if self._wanted == wanted:
                started = time.monotonic()
                loop = asyncio.get_running_loop()
                backend = await loop.run_in_executor(self._loader, self._make_backend, *wanted)
        except Exception:
            self._log.exception("standby could not be loaded", layers=f"[{wanted[0]}, {wanted[1]})")
            return
        finally:
            self._loading = None
        if backend is None or self._wanted != wanted:  # the plan changed while it settled or loaded
            if backend is not None:
                gone = weakref.ref(backend)
                del backend
                self._free(gone)
            self.follow(self._wanted)
            return
        self.backend = backend
        self._beat_soon()
        self._log.info(
            "standby loaded",
            layers=f"[{wanted[0]}, {wanted[1]})",
            weight_mb=round(backend.weight_bytes / 2**20, 1),
            load_s=round(time.monotonic() - started, 2),
        )

    def take(self, start: int, end: int, own: Backend | None, beside: bool) -> Backend | None:
        """The backend for a stage of layers [start, end) from the standby (alone, or stacked with
        `own`, the node's running backend, shared when the new stage loads `beside` it); None
        when the standby does not make that range."""
        standby = self.backend
        if standby is None:
            return None
        if (standby.start, standby.end) == (start, end):
            self.backend = None
            return standby
        if own is None:
            return None
        mine = share_weights(own) if beside else own
        if own.end == standby.start and (own.start, standby.end) == (start, end):
            parts = [mine, standby]
        elif standby.end == own.start and (standby.start, own.end) == (start, end):
            parts = [standby, mine]
        else:
            return None
        self.backend = None
        return StackedBackend(parts)

    def let_go(self) -> None:
        standby, self.backend = self.backend, None
        if standby is None:
            return
        self._log.info("standby let go", layers=f"[{standby.start}, {standby.end})")
        gone = weakref.ref(standby)
        del standby
        self._free(gone)

    def close(self) -> None:
        self.let_go()
        if self._own_loader and isinstance(self._loader, ThreadPoolExecutor):
            self._loader.shutdown(wait=False, cancel_futures=True)
