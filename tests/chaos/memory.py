"""Resident memory of a local cluster's processes, to check that a fault leaves no growth behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import psutil

from mohawk_cli.cluster import LocalCluster
from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import decode_json
from mohawk_proto.v1 import bus_pb2

# After a warm-up the processes hold their steady allocations (weights, the KV pool, allocator
# caches); a fault may add buffers the allocator keeps, which is not a leak, hence the slack.
GROWTH = 1.10
SLACK_BYTES = 32 << 20
# an idle process gives its freed heap back once it has been idle 2 s (`memory_trim`): a level is
# come back to when it is within this long of the load's end
SETTLE_S = 10.0

Growth = TypeVar("Growth")


def resident_bytes(cluster: LocalCluster) -> dict[str, int]:
    """RSS of every live child, nats-server included, once every shard node's KV pools are
    resident (each is faulted in a few seconds after its stage loads)."""
    cluster.wait_pools_resident()
    found = {name: proc.pid for name, proc in cluster.processes.items() if proc.poll() is None}
    if cluster.nats.process is not None and cluster.nats.process.poll() is None:
        found["nats"] = cluster.nats.process.pid
    return {name: psutil.Process(pid).memory_info().rss for name, pid in found.items()}


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Processes (present both times) whose RSS grew past GROWTH × before + SLACK_BYTES, MiB."""
    return {
        name: (before[name] >> 20, after[name] >> 20)
        for name in before.keys() & after.keys()
        if after[name] > before[name] * GROWTH + SLACK_BYTES
    }


def total_grown(
    before: dict[str, int], after: dict[str, int], pools: tuple[int, int] = (0, 0)
) -> tuple[int, int] | None:
    """(before, after) MiB when the cluster's total RSS, less its plan's KV pools (`pools`: bytes
    before and after), grew past GROWTH × before + SLACK_BYTES: for faults that move work (a dead
    node's layers go to the others), only the sum must hold. The pools come off because a plan
    sizes them: every stage keeps the same block count, the most its fullest node fits, so a plan
    that splits the layers unevenly (by measured speed) gives its other stages smaller pools than
    the even split after a re-plan does."""
    total_before, total_after = sum(before.values()) - pools[0], sum(after.values()) - pools[1]
    if total_after > total_before * GROWTH + SLACK_BYTES:
        return total_before >> 20, total_after >> 20
    return None


def settled(growth: Callable[[], Growth], within_s: float = SETTLE_S) -> Growth:
    """`growth()` once it reports none (falsy), or its last report after `within_s`."""
    deadline = time.monotonic() + within_s
    found = growth()
    while found and time.monotonic() < deadline:
        time.sleep(0.5)
        found = growth()
    return found


def kv_pool_bytes(cluster: LocalCluster, plan: bus_pb2.Plan | None, within_s: float = 10.0) -> int:
    """Bytes of KV cache the plan's stages hold (each is resident whole once `resident_bytes` has
    waited for it): the plan's block count × the stage's layers × what its node reports a block of one
    layer costs (heartbeats, read as the ops tool user)."""
    assert plan is not None, "no plan in KV"
    wanted = {stage.node_id for stage in plan.stages}

    async def block_bytes() -> dict[str, int]:
        heard: dict[str, int] = {}
        nc = await connect(cluster.nats.url, name="test-memory", creds=cluster.nats_creds("ops"))
        try:
            sub = await nc.subscribe(names.HEARTBEAT_WILDCARD)
            deadline = time.monotonic() + within_s
            while not wanted <= heard.keys() and time.monotonic() < deadline:
                hb = decode_json(bus_pb2.Heartbeat, (await sub.next_msg(timeout=within_s)).data)
                heard[hb.node_id] = hb.kv_block_bytes_per_layer
        finally:
            await nc.close()
        assert wanted <= heard.keys(), f"no heartbeat from {sorted(wanted - heard.keys())}"
        return heard

    per_layer = asyncio.run(block_bytes())
    return sum(plan.num_kv_blocks * (s.end - s.start) * per_layer[s.node_id] for s in plan.stages)
