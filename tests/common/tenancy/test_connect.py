"""`connect`'s pool under a burst: more commands at once than it has connections wait their turn
(redis-py's default pool raised "Too many connections" at its 101st, which the 1,000-session load
test hit on a busy gateway as 503s)."""

from __future__ import annotations

import asyncio

from mohawk_common.tenancy import POOL_SIZE, connect


def test_a_burst_larger_than_the_pool_waits_for_connections(redis_url: str) -> None:
    async def run() -> list[object]:
        client = connect(redis_url)
        try:
            # each BLPOP holds its connection for 50 ms: three pools' worth cannot all run at once
            burst = [client.blpop([f"mohawk-test-empty-{i}"], timeout=0.05) for i in range(3 * POOL_SIZE)]
            return await asyncio.gather(*burst)
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [None] * (3 * POOL_SIZE)
