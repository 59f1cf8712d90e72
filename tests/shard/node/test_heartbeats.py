"""A node's heartbeats keep their interval while its compute thread is busy: the idle-time heap
trim, which queues on the compute executor behind a running step, is never waited for by the
heartbeat loop. Against a real nats-server; the step is a job holding the compute thread."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.security import Security
from mohawk_common.bus.server import NatsServer
from mohawk_common.memory_trim import load_malloc_trim
from mohawk_pqc.kem import CryptographyKem
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.config import NodeSettings
from mohawk_shard.node.service import ShardNode

INTERVAL_S = 0.2
STEP_S = 4.0  # one long step, past the node timeout's 3 s


def bare_node(**settings: object) -> ShardNode:
    """A shard node with no model: its snapshot is None and its heartbeat a bare one."""
    values = {"node_id": "n1", "insecure": True, **settings}
    node = ShardNode(NodeSettings.model_validate(values), Security(None, CryptographyKem(), role="shard"))
    node.snapshot = lambda: None  # type: ignore[method-assign,assignment,return-value]
    node.heartbeat = lambda _snapshot=None: bus_pb2.Heartbeat(node_id="n1", role="shard")  # type: ignore[method-assign]
    return node


@contextlib.asynccontextmanager
async def beating(url: str, node: ShardNode) -> AsyncIterator[list[float]]:
    """`node`'s heartbeat loop running on a real bus, and when each heartbeat arrived at a probe."""
    node.nc = await connect([url], name="probe-node", attempts=3)
    probe = await connect([url], name="probe", attempts=3)
    arrivals: list[float] = []

    async def on_beat(_msg: object) -> None:
        arrivals.append(time.monotonic())

    await probe.subscribe(names.heartbeat_subject("n1"), cb=on_beat)
    await probe.flush()
    loop = asyncio.create_task(node._heartbeat_loop())
    try:
        yield arrivals
    finally:
        loop.cancel()
        await probe.close()
        await node.nc.close()
        node.executor.shutdown(wait=False)


@pytest.mark.slow  # over 5 s here: the inner loop leaves it to `make test`
def test_heartbeats_keep_their_interval_while_a_long_step_holds_the_compute_thread(
    nats_server: NatsServer,
) -> None:
    if load_malloc_trim() is None:
        pytest.skip("no malloc_trim in this C library: the node never trims")
    node = bare_node(heartbeat_interval_s=INTERVAL_S, telemetry=False)
    role = SimpleNamespace(num_steps=1)
    node.stages.current = SimpleNamespace(role=role)  # type: ignore[assignment]

    async def scenario() -> list[float]:
        async with beating(nats_server.url, node) as arrivals:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(0.5)
            role.num_steps = 2  # a step ran; from now on the counter stands still: the node looks idle
            step = loop.run_in_executor(node.executor, time.sleep, STEP_S)  # ... while a long step runs
            await step
            await asyncio.sleep(0.5)
        return arrivals

    arrivals = asyncio.run(scenario())
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert max(gaps) < 1.0, f"a heartbeat waited {max(gaps):.2f} s on the compute thread"
    assert len(arrivals) >= STEP_S / INTERVAL_S, arrivals


def test_an_early_heartbeat_goes_out_at_once_and_the_telemetry_report_keeps_the_interval(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stage 0 asks for a heartbeat whenever it takes requests (`beat_soon`): it goes out within
    `EARLY_BEAT_S`, a 2 s interval notwithstanding, while the step report and the idle trim are
    made once an interval, however often the heartbeat is asked for."""
    from mohawk_shard.node import service

    reports: list[float] = []

    def step_report(_snapshot: object, _window: object) -> SimpleNamespace:
        reports.append(time.monotonic())
        return SimpleNamespace(model_dump_json=lambda: "{}")

    monkeypatch.setattr(service, "step_report", step_report)
    node = bare_node(heartbeat_interval_s=2.0, telemetry=True)

    async def scenario() -> list[float]:
        async with beating(nats_server.url, node) as arrivals:
            await asyncio.sleep(0.3)  # the first heartbeat, at the start
            for _ in range(8):  # requests taken every 0.15 s
                node.beat_soon()
                await asyncio.sleep(0.15)
            await asyncio.sleep(0.2)
        return arrivals

    arrivals = asyncio.run(scenario())
    assert len(arrivals) >= 8, arrivals  # the first, then one for each ask (not one in 2 s)
    assert len(reports) == 1, reports  # the interval's, at the start; none of the early ones


def test_a_stage_just_loaded_beats_at_once_without_waiting_for_a_burst(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`beat_soon` gathers a burst for `EARLY_BEAT_S`; `beat_now` (a stage loaded: the coordinator
    activates the plan on hearing it) does not wait. The gathering wait is set to 30 s here, so a
    beat that came within 5 s of asking did not wait for it."""
    from mohawk_shard.node import service

    monkeypatch.setattr(service, "EARLY_BEAT_S", 30.0)
    node = bare_node(heartbeat_interval_s=2.0, telemetry=False)

    async def scenario() -> tuple[list[float], float, float]:
        async with beating(nats_server.url, node) as arrivals:
            await asyncio.sleep(0.3)  # the first heartbeat, at the start
            node.beat_soon()  # gathers for 5 s ...
            await asyncio.sleep(0.3)
            asked = time.monotonic()
            node.beat_now()  # ... unless a stage loaded meanwhile: out now
            deadline = asked + 5.0
            while len(arrivals) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return list(arrivals), asked, time.monotonic()

    arrivals, asked, ended = asyncio.run(scenario())
    assert len(arrivals) == 2, f"no heartbeat within {ended - asked:.1f} s of beat_now: {arrivals}"
    assert arrivals[1] >= asked
