"""A node's heartbeats keep their interval while its compute thread is busy: the idle-time heap
trim, which queues on the compute executor behind a running step, is never waited for by the
heartbeat loop. Against a real nats-server; the step is a job holding the compute thread."""

from __future__ import annotations

import asyncio
import itertools
import time
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


@pytest.mark.slow  # over 5 s here: the inner loop leaves it to `make test`
def test_heartbeats_keep_their_interval_while_a_long_step_holds_the_compute_thread(
    nats_server: NatsServer,
) -> None:
    if load_malloc_trim() is None:
        pytest.skip("no malloc_trim in this C library: the node never trims")
    settings = NodeSettings.model_validate(
        {"node_id": "n1", "insecure": True, "heartbeat_interval_s": INTERVAL_S, "telemetry": False}
    )
    node = ShardNode(settings, Security(None, CryptographyKem(), role="shard"))
    node.snapshot = lambda: None  # type: ignore[method-assign,assignment,return-value]
    node.heartbeat = lambda _snapshot=None: bus_pb2.Heartbeat(node_id="n1", role="shard")  # type: ignore[method-assign]
    role = SimpleNamespace(num_steps=1)
    node.stages.current = SimpleNamespace(role=role)  # type: ignore[assignment]

    async def scenario() -> list[float]:
        node.nc = await connect([nats_server.url], name="probe-node", attempts=3)
        probe = await connect([nats_server.url], name="probe", attempts=3)
        arrivals: list[float] = []

        async def on_beat(_msg: object) -> None:
            arrivals.append(time.monotonic())

        await probe.subscribe(names.heartbeat_subject("n1"), cb=on_beat)
        beating = asyncio.create_task(node._heartbeat_loop())
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.5)
        role.num_steps = 2  # a step ran; from now on the counter stands still: the node looks idle
        step = loop.run_in_executor(node.executor, time.sleep, STEP_S)  # ... while a long step runs
        await step
        await asyncio.sleep(0.5)
        beating.cancel()
        await probe.close()
        await node.nc.close()
        node.executor.shutdown(wait=False)
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
    settings = NodeSettings.model_validate(
        {"node_id": "n1", "insecure": True, "heartbeat_interval_s": 2.0, "telemetry": True}
    )
    node = ShardNode(settings, Security(None, CryptographyKem(), role="shard"))
    node.snapshot = lambda: None  # type: ignore[method-assign,assignment,return-value]
    node.heartbeat = lambda _snapshot=None: bus_pb2.Heartbeat(node_id="n1", role="shard")  # type: ignore[method-assign]

    async def scenario() -> list[float]:
        node.nc = await connect([nats_server.url], name="probe-node", attempts=3)
        probe = await connect([nats_server.url], name="probe", attempts=3)
        arrivals: list[float] = []

        async def on_beat(_msg: object) -> None:
            arrivals.append(time.monotonic())

        await probe.subscribe(names.heartbeat_subject("n1"), cb=on_beat)
        await probe.flush()
        beating = asyncio.create_task(node._heartbeat_loop())
        await asyncio.sleep(0.3)  # the first heartbeat, at the start
        for _ in range(8):  # requests taken every 0.15 s
            node.beat_soon()
            await asyncio.sleep(0.15)
        await asyncio.sleep(0.2)
        beating.cancel()
        await probe.close()
        await node.nc.close()
        node.executor.shutdown(wait=False)
        return arrivals

    arrivals = asyncio.run(scenario())
    assert len(arrivals) >= 8, arrivals  # the first, then one for each ask (not one in 2 s)
    assert len(reports) == 1, reports  # the interval's, at the start; none of the early ones
