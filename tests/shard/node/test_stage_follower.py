"""The plan follower carrying out its decisions, with stand-in roles and no model, bus or NATS:
stage 0 starts only once its pipeline is active, a later stage at once; a stage loaded beside
the running one takes over (and the old one stops) when its pipeline turns active; a node left
out serves on until a pipeline of the new plan is active, then stops; counters of stopped roles
are kept; a backend let go is freed at once, even where reference cycles hold it."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Set
from types import SimpleNamespace

import pytest

from mohawk_common.bus.pipelines import ACTIVE, LOADING
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.hops import HopStats
from mohawk_shard.node.snapshot import Following, StageSnapshot
from mohawk_shard.node.stage_follower import Serving, StageFollower
from mohawk_shard.node.stage_plan import StageAssignment


class FakeRole:
    def __init__(self, placement: StageAssignment) -> None:
        self.view, self.stage_index = placement.view, placement.index
        self.waits_for_active = placement.index == 0
        self.hops = HopStats()
        self.num_steps = self.num_failed_steps = self.num_expired_steps = 0
        self.events: list[str] = []
        self.routes: tuple[frozenset[int], bool] | None = None
        self.compute = SimpleNamespace(stage=None)  # no stage: nothing to carry

    def stage_snapshot(self) -> StageSnapshot:
        raise NotImplementedError

    def follow_pipelines(self, active: Set[int], *, drains: bool) -> None:
        self.routes = (frozenset(active), drains)

    async def start(self) -> None:
        self.events.append("start")

    async def stop(self) -> None:
        self.events.append("stop")


class FakeBackend:
    """Stands in for weights and a KV pool; it refers to itself as a real role's objects do (its
    tasks call back into it), so only a collection frees it."""

    def __init__(self) -> None:
        self.cycle = self


class Harness(StageFollower):
    """A follower whose loads build stand-in roles, and whose memory always has room beside."""

    def __init__(self, make_before_break: bool = True) -> None:
        settings = SimpleNamespace(make_before_break=make_before_break, backend="torch", kv_carry=True)
        host = SimpleNamespace(node_id="n1", settings=settings, source=None, executor=None)
        host.beat_soon, host.beat_now, host.started_at_ms = lambda: None, lambda: None, 1
        host.cores_anew = lambda: None
        super().__init__(host)  # type: ignore[arg-type]
        self.loads: list[tuple[int, int, bool]] = []

    async def load_stage(self, asked: StageAssignment, *, beside: bool) -> None:
        self.loads.append((asked.view.epoch, asked.index, beside))
        self.stage_index, self.loaded = asked.index, False
        serving = Serving(FakeRole(asked), backend=FakeBackend())  # type: ignore[arg-type]
        if not serving.role.waits_for_active:
            await serving.role.start()
            serving.started = True
        if beside:
            self.next = serving
        else:
            self.current, self._backend = serving, serving.backend
        self.loaded = True

    def _room_beside(self, asked: StageAssignment) -> bool:
        return True

    @property
    def fake(self) -> FakeRole:
        assert self.current is not None
        return self.current.role  # type: ignore[return-value]


def plan(version: int, *nodes: str, state: str = ACTIVE, spares: tuple[str, ...] = ()) -> bus_pb2.Plan:
    step = 30 // len(nodes)
    stages = [bus_pb2.PlanStage(node_id=n, start=i * step, end=(i + 1) * step) for i, n in enumerate(nodes)]
    return bus_pb2.Plan(
        version=version,
        model="m",
        num_layers=30,
        stages=stages,
        spares=list(spares),
        num_kv_blocks=8,
        block_size=16,
        state=state,
    )


def test_stage_0_starts_once_its_pipeline_is_active_and_a_kept_plan_changes_nothing() -> None:
    follower = Harness()
    asyncio.run(follower.follow(plan(1, "n1", "n2", state=LOADING)))
    head = follower.fake
    assert follower.loads == [(1, 0, False)] and head.events == []  # loaded, pulls nothing yet
    assert follower.following() == Following(1, 0, True)
    asyncio.run(follower.follow(plan(1, "n1", "n2", state=ACTIVE)))
    assert follower.fake is head and head.events == ["start"] and follower.loads == [(1, 0, False)]
    assert head.routes == (frozenset({0}), True)
    asyncio.run(follower.follow(plan(0, "n2", "n1")))  # an older plan is ignored
    assert follower.fake is head and follower.following() == Following(1, 0, True)


def test_a_later_stage_starts_at_once() -> None:
    follower = Harness()
    asyncio.run(follower.follow(plan(1, "n2", "n1", state=LOADING)))
    assert follower.fake.events == ["start"] and follower.following() == Following(1, 1, True)


def test_another_stage_loads_beside_and_takes_over_when_active() -> None:
    follower = Harness()
    asyncio.run(follower.follow(plan(1, "n2", "n1")))
    old = follower.fake
    asyncio.run(follower.follow(plan(2, "n1", "n2", state=LOADING)))
    assert follower.loads[-1] == (2, 0, True) and follower.fake is old  # the old stage serves on
    assert follower.following() == Following(2, 0, True)
    old.num_failed_steps = 3
    asyncio.run(follower.follow(plan(2, "n1", "n2", state=ACTIVE)))
    assert old.events == ["start", "stop"] and follower.next is None
    assert follower.fake.stage_index == 0 and follower.fake.events == ["start"]
    assert follower.step_counts() == (3, 0)  # a stopped role's counts stay counted


@pytest.mark.parametrize("make_before_break", [True, False])
def test_without_make_before_break_the_old_stage_stops_first(make_before_break: bool) -> None:
    follower = Harness(make_before_break)
    asyncio.run(follower.follow(plan(1, "n2", "n1")))
    old = follower.fake
    asyncio.run(follower.follow(plan(2, "n1", "n2", state=LOADING)))
    beside = follower.loads[-1][2]
    assert beside is make_before_break
    assert old.events == (["start"] if make_before_break else ["start", "stop"])


def test_left_out_the_node_serves_on_until_a_pipeline_of_the_plan_is_active() -> None:
    follower = Harness()
    asyncio.run(follower.follow(plan(1, "n2", "n1")))
    old = follower.fake
    asyncio.run(follower.follow(plan(2, "n2", state=LOADING, spares=("n1",))))
    assert follower.fake is old and old.events == ["start"] and follower.following() == Following(0, -1, True)
    asyncio.run(follower.follow(plan(2, "n2", state=ACTIVE, spares=("n1",))))
    assert follower.current is None and old.events == ["start", "stop"]


def test_a_stage_let_go_is_freed_at_once_though_cycles_hold_it() -> None:
    follower = Harness()
    gc.disable()  # the cycle collector would free it some time; the follower must do it now
    try:
        asyncio.run(follower.follow(plan(1, "n2", "n1")))
        assert follower.current is not None
        first = weakref.ref(follower.current.backend)
        asyncio.run(follower.follow(plan(2, "n1", "n2", state=LOADING)))  # loads beside it
        assert first() is not None and follower.next is not None
        beside = weakref.ref(follower.next.backend)
        asyncio.run(follower.follow(plan(3, "n2", "n1", state=LOADING)))  # the one beside is let go
        assert beside() is None and first() is not None  # the running stage serves on
        asyncio.run(follower.follow(plan(4, "n1", "n2", state=LOADING)))
        asyncio.run(follower.follow(plan(4, "n1", "n2", state=ACTIVE)))  # switched
        assert first() is None and follower.current is not None
        second = weakref.ref(follower.current.backend)
        asyncio.run(follower.follow(plan(5, "n2", state=ACTIVE, spares=("n1",))))  # left out
        assert follower.current is None and second() is None
    finally:
        gc.enable()
