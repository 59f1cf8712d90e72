"""Resident memory of a local cluster's processes, to check that a fault leaves no growth behind."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psutil

from mohawk_cli.cluster import LocalCluster

# After a warm-up the processes hold their steady allocations (weights, the KV pool, allocator
# caches); a fault may add buffers the allocator keeps, which is not a leak, hence the slack.
GROWTH = 1.10
SLACK_BYTES = 32 << 20
# an idle process gives its freed heap back once it has been idle 2 s (`memory_trim`): a level is
# come back to when it is within this long of the load's end
SETTLE_S = 10.0

Growth = TypeVar("Growth")


def resident_bytes(cluster: LocalCluster) -> dict[str, int]:
    """RSS of every live child, nats-server included."""
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


def total_grown(before: dict[str, int], after: dict[str, int]) -> tuple[int, int] | None:
    """(before, after) MiB when the cluster's total RSS grew past GROWTH × before + SLACK_BYTES: for
    faults that move work (a dead node's layers go to the others), only the sum must hold. A KV
    pool is resident only where steps have written it (`lazy_zeros` maps it untouched), so a plan
    that sizes the pools otherwise after the fault leaves the sum as it was."""
    total_before, total_after = sum(before.values()), sum(after.values())
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
