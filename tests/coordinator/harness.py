"""Coordinators in this process against a real nats-server, with a small synthetic model."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import read_plan
from mohawk_common.bus.security import Security
from mohawk_common.bus.setup import Buckets, ensure_buckets
from mohawk_common.tasks import cancel_and_wait
from mohawk_coordinator.config import CoordinatorSettings
from mohawk_coordinator.coordinator import Coordinator
from mohawk_coordinator.plan_inputs import ModelShape
from mohawk_coordinator.planner import ModelFootprint
from mohawk_pqc.identity import Identity
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle
from mohawk_proto.v1 import bus_pb2

MIB = 2**20
TTL_S = 1.5
# SmolLM2-135M-like, as `FakeNode`s report it: 30 layers of 13.5 MiB, 108 MiB embedding and head,
# fp32 KV of 3 heads × 64
SHAPE = ModelShape(
    ModelFootprint("tiny-llama", 30, int(13.5 * MIB), 108 * MIB, 108 * MIB),
    max_position_embeddings=8192,
    kv_bytes_per_token_per_layer=2 * 3 * 64 * 4,
    weights_formats=("fp32",),
)


def settings(url: str, coordinator_id: str, **overrides: Any) -> CoordinatorSettings:
    values: dict[str, Any] = {
        "nats_url": url,
        "coordinator_id": coordinator_id,
        "lease_ttl_s": TTL_S,
        "heartbeat_interval_s": 0.2,
        "node_ttl_s": 0.6,
        "placement": "spread",
        "replicas": 1,
        # explicit, so neither MOHAWK_* variables nor config/mohawk.yaml change what tests expect
        "model": None,
        "served_model_name": None,
        "block_size": 16,
        "max_model_len": None,
        "state_dir": Path(tempfile.mkdtemp(prefix=f"mohawk-{coordinator_id}-")),
    }
    return CoordinatorSettings(**(values | overrides))


@dataclass
class Replica:
    coordinator: Coordinator
    task: asyncio.Task[None]
    nc: Client

    async def crash(self) -> None:
        """Like kill -9: stop everything at once, leave the lease to expire."""
        await cancel_and_wait(self.task)  # one cancel can be lost inside nats-py on 3.11
        await self.nc.close()

    async def stop(self) -> None:
        self.coordinator.stop()
        await asyncio.wait_for(self.task, 5)
        await self.nc.close()


async def start_replica(url: str, coordinator_id: str, **overrides: Any) -> Replica:
    nc = await connect(url, name=coordinator_id)
    config = settings(url, coordinator_id, **overrides)
    buckets = await ensure_buckets(nc.jetstream(), config.bus_limits())
    coordinator = Coordinator(config, nc, buckets)
    return Replica(coordinator, asyncio.create_task(coordinator.run()), nc)


async def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `condition` every 10 ms; the seconds it took."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def wait_for_plan(
    buckets: Buckets, condition: Callable[[bus_pb2.Plan], bool], timeout: float, what: str
) -> bus_pb2.Plan:
    deadline = time.monotonic() + timeout
    while True:
        plan = await read_plan(buckets.plan)
        if plan is not None and condition(plan):
            return plan
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; plan is {plan}")
        await asyncio.sleep(0.02)


def stage_ranges(plan: bus_pb2.Plan) -> list[tuple[str, int, int]]:
    return [(s.node_id, s.start, s.end) for s in plan.stages]


@dataclass
class SecureReplica:
    """A certified coordinator replica (its bundle under `<pki_dir>/nodes/<id>`) and what tests read."""

    replica: Replica
    security: Security
    buckets: Buckets


async def start_secure_replica(
    url: str, pki_dir: Path, coordinator_id: str, **overrides: Any
) -> SecureReplica:
    nc = await connect(url, name=coordinator_id)
    config = settings(url, coordinator_id, **overrides)
    buckets = await ensure_buckets(nc.jetstream(), config.bus_limits())
    security = Security.load(
        role="coordinator", bundle_dir=pki_dir / "nodes" / coordinator_id, insecure=False
    )
    coordinator = Coordinator(config, nc, buckets, security=security)
    return SecureReplica(Replica(coordinator, asyncio.create_task(coordinator.run()), nc), security, buckets)


def issue_pki(pki_dir: Path, *nodes: str) -> dict[str, Identity]:
    """A PKI under `pki_dir` with coordinator `coord-a` and shard nodes `nodes`; the nodes' identities."""
    init_pki(pki_dir)
    issue_node(pki_dir, "coord-a", "coordinator")
    for node in nodes:
        issue_node(pki_dir, node, "shard")
    return {node: load_bundle(pki_dir / "nodes" / node, role="shard").identity for node in nodes}
