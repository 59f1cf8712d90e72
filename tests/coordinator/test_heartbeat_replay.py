"""A stopped node's recorded heartbeat, replayed, does not keep it in the plan (real nats-server,
certified leader): it used to stay planned 5 s after it stopped, against a 0.6 s node timeout."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import NatsServer
from tests.coordinator.fake_node import FakeNode
from tests.coordinator.harness import issue_pki, start_secure_replica, wait_for_plan


def test_a_replayed_heartbeat_does_not_keep_a_stopped_node_planned(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    identities = issue_pki(tmp_path, "node-0", "node-1")

    async def scenario() -> None:
        started = await start_secure_replica(nats_server.url, tmp_path, "coord-a")
        replica, security, buckets = started.replica, started.security, started.buckets
        nodes_nc = await connect(nats_server.url, name="nodes")
        nodes = [await FakeNode(nodes_nc, n, identity=identity).start() for n, identity in identities.items()]
        await wait_for_plan(buckets, lambda p: len(p.stages) == 2, 10, "a plan over both nodes")
        await nodes[1].stop()
        recorded = nodes[1].last_sent

        async def replay() -> None:  # every 0.1 s, faster than the node itself beat
            while True:
                await nodes_nc.publish(names.heartbeat_subject("node-1"), recorded)
                await asyncio.sleep(0.1)

        replaying = asyncio.create_task(replay())
        plan = await wait_for_plan(buckets, lambda p: len(p.stages) == 1, 5, "a plan without node-1")
        assert [s.node_id for s in plan.stages] == ["node-0"]
        assert security.rejections["replayed"] > 0
        replaying.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await replaying
        await replica.stop()
        await nodes[0].stop()
        await nodes_nc.close()

    asyncio.run(scenario())
