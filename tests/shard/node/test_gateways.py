"""Gateway presence against a real nats-server: a key that lapses (TTL) makes its gateway gone after the
grace; a key refreshed in time never does; no verdict while the bus is away."""

from __future__ import annotations

import asyncio
import contextlib

from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import BusLimits, ensure_buckets
from mohawk_shard.node.gateways import GatewayPresence


def test_a_lapsed_gateway_is_gone_after_the_grace(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        nc = await connect(nats_server.url, name="test")
        js = nc.jetstream()
        buckets = await ensure_buckets(js, BusLimits(gateway_ttl_s=1.0))
        await buckets.gateways.put("alive", b"1")
        await buckets.gateways.put("dead", b"1")
        presence = GatewayPresence(js, grace_s=1.0)
        loop = asyncio.get_running_loop()
        assert await presence.gone({"alive", "dead"}, loop.time()) == set()
        gone: set[str] = set()
        for _ in range(40):  # TTL 1 s + grace 1 s, checked every 0.1 s
            await asyncio.sleep(0.1)
            await buckets.gateways.put("alive", b"1")
            gone = await presence.gone({"alive", "dead"}, loop.time())
            if gone:
                break
        assert gone == {"dead"}
        nats_server.kill()
        await asyncio.sleep(0.2)
        assert await presence.gone({"alive", "dead"}, loop.time()) == set()  # no bus, no verdict
        with contextlib.suppress(Exception):
            await nc.close()

    asyncio.run(scenario())
