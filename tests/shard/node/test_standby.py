"""A node's warm standby on real (tiny) torch backends: loaded in the background when a plan asks
for it and reported held, handed over whole or stacked under the node's own stage, let go when
the plan asks for another range, and a load the plan changed under is not kept."""

from __future__ import annotations

import asyncio
import gc
import weakref
from types import SimpleNamespace

import pytest

from mohawk_common.model_store import ModelSource
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.backends import make_backend
from mohawk_shard.backends.stacked import StackedBackend
from mohawk_shard.engine.backend import Backend
from mohawk_shard.engine.kv_carry import CarriedPart, Carry
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.stage import SequenceSpec, SequenceStep, Stage, StepBatch
from mohawk_shard.node.config import NodeSettings
from mohawk_shard.node.pipeline_view import view_of
from mohawk_shard.node.stage_follower import Serving, StageFollower, free_now
from mohawk_shard.node.stage_plan import StageAssignment
from mohawk_shard.node.standby import NONE, WarmStandby, asked_of, mirrors_to_next
from tests.shard.engine import test_architectures as architectures


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> ModelSource:
    return architectures.tiny_source(tmp_path_factory)


class Loads:
    """What the standby was asked to load and how often it asked for a heartbeat."""

    def __init__(self, source: ModelSource) -> None:
        self.source, self.ranges, self.beats = source, list[tuple[int, int]](), 0

    def make(self, start: int, end: int) -> Backend:
        self.ranges.append((start, end))
        return make_backend("torch", self.source, start, end, device="cpu")

    def beat(self) -> None:
        self.beats += 1


def standby(loads: Loads, settle_s: float = 0.0) -> WarmStandby:
    return WarmStandby("n1", loads.make, None, loads.beat, lambda gone: free_now(gone, held=()), settle_s)


async def settled(holder: WarmStandby) -> None:
    for _ in range(200):
        if holder._loading is None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the standby never finished loading")


def test_the_plan_names_the_range_of_this_run_only() -> None:
    plan = bus_pb2.Plan(standbys=[bus_pb2.PlanStandby(node_id="n1", start=2, end=4, node_started_at_ms=7)])
    assert asked_of(plan, "n1", 7) == (2, 4)
    assert asked_of(plan, "n1", 8) == NONE and asked_of(plan, "n2", 7) == NONE


def test_held_whole_or_stacked_under_the_nodes_stage_then_let_go(tiny_source: ModelSource) -> None:
    async def scenario() -> None:
        loads = Loads(tiny_source)
        holder = standby(loads)
        holder.follow((2, 4))
        assert holder.held == NONE  # loading in the background
        await settled(holder)
        assert holder.held == (2, 4) and loads.beats == 1
        assert holder.take(0, 4, None, beside=False) is None  # nothing to stack it under
        taken = holder.take(2, 4, None, beside=False)
        assert taken is not None and (taken.start, taken.end) == (2, 4) and holder.held == NONE

        holder.follow((2, 4))
        await settled(holder)
        own = loads.make(0, 2)
        assert holder.take(0, 3, own, beside=False) is None and holder.held == (2, 4)
        stacked = holder.take(0, 4, own, beside=True)
        assert isinstance(stacked, StackedBackend) and (stacked.start, stacked.end) == (0, 4)
        assert stacked.parts[0] is not own and stacked.parts[0].model is own.model  # shared weights
        assert holder.held == NONE

        holder.follow((0, 2))  # a standby before the node's own range stacks first
        await settled(holder)
        behind = loads.make(2, 4)
        stacked = holder.take(0, 4, behind, beside=False)
        assert isinstance(stacked, StackedBackend) and stacked.parts[1] is behind

        holder.follow((2, 4))
        await settled(holder)
        gone = weakref.ref(holder.backend)
        holder.follow((0, 2))  # another range: the held one goes at once
        gc.collect()
        assert gone() is None
        await settled(holder)
        assert holder.held == (0, 2)
        holder.follow(NONE)
        assert holder.held == NONE
        holder.close()

    asyncio.run(scenario())


def test_a_load_the_plan_changed_under_is_not_kept(tiny_source: ModelSource) -> None:
    async def scenario() -> None:
        loads = Loads(tiny_source)
        holder = standby(loads)
        holder.follow((2, 4))
        for _ in range(200):  # until the load is under way on the loader thread
            if loads.ranges:
                break
            await asyncio.sleep(0.005)
        holder.follow((0, 2))  # asked for another range while the first loads
        await settled(holder)
        await settled(holder)
        assert loads.ranges == [(2, 4), (0, 2)] and holder.held == (0, 2)
        holder.close()

    asyncio.run(scenario())


def test_a_load_waits_out_the_settle_and_loads_only_the_last_range_asked(tiny_source: ModelSource) -> None:
    """After a failover the plan asks for new standbys at once; they wait `settle_s`, so the
    resume has the CPU, and a range asked for and changed meanwhile is never loaded."""

    async def scenario() -> None:
        loads = Loads(tiny_source)
        holder = standby(loads, settle_s=2.0)
        holder.follow((2, 4))
        await asyncio.sleep(0.2)
        assert loads.ranges == [] and holder.held == NONE  # settling
        holder.follow((0, 2))  # the next plan asks for another range
        await settled(holder)
        await settled(holder)
        assert loads.ranges == [(0, 2)] and holder.held == (0, 2)
        holder.close()

    asyncio.run(scenario())


def test_a_widened_stage_loads_only_the_layers_it_lacks_and_takes_the_kv_carried(
    tiny_source: ModelSource,
) -> None:
    """A re-plan that widens this node's stage over a dead neighbour's layers, with no standby:
    the running weights stay, the missing layers load beside them (stacked), and the KV the stopped
    stage carried is handed to the new one (`kv_carry`)."""
    layers = tiny_source.config.num_layers
    settings = NodeSettings(node_id="n1", model=str(tiny_source.path), device="cpu", kv_carry=True)
    host = SimpleNamespace(
        node_id="n1", settings=settings, source=tiny_source, executor=None, loader=None, started_at_ms=1
    )
    host.beat_soon = host.beat_now = lambda: None
    follower = StageFollower(host)  # type: ignore[arg-type]
    own = make_backend("torch", tiny_source, 2, layers, device="cpu")
    follower._backend = own
    follower.carry = Carry({"req": {(2, layers): CarriedPart(kv=[], length=3)}})
    plan = bus_pb2.Plan(
        version=2,
        model="m",
        num_layers=layers,
        num_kv_blocks=8,
        block_size=4,
        state="loading",
        stages=[bus_pb2.PlanStage(node_id="n1", start=0, end=layers)],
    )
    found = view_of(plan, "n1")
    assert found is not None
    stage, backend = follower._load(StageAssignment(*found), beside=False)
    assert isinstance(backend, StackedBackend) and backend.parts[1] is own and follower.widened
    assert [(p.start, p.end) for p in backend.parts] == [(0, 2), (2, layers)]
    assert stage.carries_kv and len(follower.carry) == 0 and "req" in stage._carry.requests


class StoppingRole:
    """A role whose stop lets its stage go, as `StageCompute.release` does."""

    num_failed_steps = num_expired_steps = 0

    def __init__(self, stage: Stage) -> None:
        self.compute = SimpleNamespace(stage=stage)
        self.stopped = False

    async def stop(self) -> None:
        self.stopped, self.compute.stage = True, None


@pytest.mark.parametrize("kv_carry", [True, False])
def test_a_stopped_stage_leaves_its_kv_for_the_next(tiny_source: ModelSource, kv_carry: bool) -> None:
    """`stop_role` (a re-plan) exports what the stopped stage held of each request, on the compute
    thread once the role has stopped; `kv_carry: false` keeps nothing."""
    layers = tiny_source.config.num_layers
    settings = NodeSettings(node_id="n1", model=str(tiny_source.path), device="cpu", kv_carry=kv_carry)
    host = SimpleNamespace(node_id="n1", settings=settings, source=tiny_source, executor=None, loader=None)
    host.beat_soon = host.beat_now = lambda: None
    host.started_at_ms = 1
    follower = StageFollower(host)  # type: ignore[arg-type]
    backend = make_backend("torch", tiny_source, 0, layers, device="cpu")
    backend.allocate_kv_cache(8, 4)
    stage = Stage(backend, 4, num_blocks=8)
    spec = SequenceSpec(3, SamplingParams.create(temperature=0.0), carry_key="req")
    stage.step(StepBatch(1, (SequenceStep(7, 0, (5, 6, 7), (0,), True, spec),)))
    role = StoppingRole(stage)
    follower.current = Serving(role, backend, started=True)  # type: ignore[arg-type]
    asyncio.run(follower.stop_role())
    assert role.stopped and follower.current is None
    held = follower.carry.requests
    if kv_carry:
        assert set(held) == {"req"} and held["req"][(0, layers)].length == 3
    else:
        assert held == {}


def three_stages(**standby: object) -> bus_pb2.Plan:
    stages = [bus_pb2.PlanStage(node_id=n, start=2 * i, end=2 * i + 2) for i, n in enumerate("abc")]
    return bus_pb2.Plan(version=3, stages=stages, standbys=[bus_pb2.PlanStandby(**standby)])  # type: ignore[arg-type]


def test_a_stage_mirrors_its_kv_only_to_the_next_stages_node_holding_its_layers() -> None:
    plan = three_stages(node_id="c", start=2, end=4, covers="b")
    views = {n: view_of(plan, n) for n in "abc"}
    assert [mirrors_to_next(plan, *views[n]) for n in "abc"] == [False, True, False]  # type: ignore[misc]
    upstream = three_stages(node_id="a", start=2, end=4, covers="b")  # its frames never reach a
    assert not mirrors_to_next(upstream, *views["b"])  # type: ignore[misc]
    other_range = three_stages(node_id="c", start=2, end=3, covers="b")
    assert not mirrors_to_next(other_range, *views["b"])  # type: ignore[misc]


@pytest.mark.parametrize("kv_mirror", [True, False])
def test_the_follower_turns_mirroring_on_and_off_as_plans_ask(
    tiny_source: ModelSource, kv_mirror: bool
) -> None:
    settings = NodeSettings(node_id="b", model=str(tiny_source.path), device="cpu", kv_mirror=kv_mirror)
    host = SimpleNamespace(node_id="b", settings=settings, source=tiny_source, executor=None, loader=None)
    host.beat_soon = lambda: None
    follower = StageFollower(host)  # type: ignore[arg-type]
    follower.mirrors.settle_s = 0.2
    backend = make_backend("torch", tiny_source, 0, 2, device="cpu")
    backend.allocate_kv_cache(8, 4)
    stage = Stage(backend, 4)
    plan = three_stages(node_id="c", start=2, end=4, covers="b")
    view, index = view_of(plan, "b")  # type: ignore[misc]
    role = SimpleNamespace(compute=SimpleNamespace(stage=stage), view=view, stage_index=index)
    follower.current = Serving(role, backend, started=True)  # type: ignore[arg-type]

    async def scenario() -> None:
        follower._mirror_as(plan)
        assert stage.mirror_kv is False  # not during the settle (a failover's catch-up)
        await asyncio.sleep(0.3)
        assert stage.mirror_kv is kv_mirror
        follower._mirror_as(three_stages(node_id="a", start=2, end=4, covers="b"))
        assert stage.mirror_kv is False  # off at once
        follower._mirror_as(plan)
        follower._mirror_as(three_stages(node_id="a", start=2, end=4, covers="b"))
        await asyncio.sleep(0.3)
        assert stage.mirror_kv is False  # asked, then not, within the settle: never on

    asyncio.run(scenario())
