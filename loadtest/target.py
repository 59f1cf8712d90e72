"""The cluster under test: one this run starts, or one already running; its tenants; the warm-up.

Design. `local_target` starts a redis-server (nothing persisted) and a 1-node local cluster with
auth on, exactly as `mohawk up --auth` would, except that the gateway may run 4,096 requests and
the request stream hold 4,096, so only the tenants' quotas ever refuse. `Target.pids` names the
processes whose RSS is measured (every child, nats-server and redis-server included); a cluster
given by URL has only those named with `--pid`. The load test owns its tenants' names: it replaces
tenants of those names (and their rate-limit buckets, which would otherwise carry a drained bucket
over from an earlier run) and removes them at the end. The warm-up runs a few sessions and chat
requests as a tenant of its own with no limits, so it touches no quota the run measures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.driver import Driver
from loadtest.measure import Recorder
from loadtest.spec import LoadSpec, TenantSpec
from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_cli.redis_server import RedisServer
from mohawk_common.bus.server import free_port
from mohawk_common.tenancy import TenantNotFound, TenantStore, connect
from mohawk_common.tenancy.rate_limits import limit_key

BUCKET_KINDS = ("requests", "tokens", "concurrency")
WARMUP_TENANT = TenantSpec("loadtest-warmup", 1.0)
NUM_WARMUP_SESSIONS = 16
NUM_WARMUP_CHATS = 4
READY_TIMEOUT_S = 240.0
# Every service: the request stream's size. The gateway: auth, its Redis, room and patience.
# stage 0 holds the whole backlog, so fair share chooses among every tenant's waiting requests
CLUSTER_ENV = {"MOHAWK_MAX_QUEUED_REQUESTS": "4096", "MOHAWK_MAX_WAITING": "4096"}
GATEWAY_ENV = {"MOHAWK_AUTH": "true", "MOHAWK_MAX_IN_FLIGHT": "4096", "MOHAWK_REQUEST_TIMEOUT_S": "900"}


@dataclass(frozen=True)
class Target:
    url: str
    redis_url: str
    pids: Mapping[str, int] = field(default_factory=dict)  # processes whose RSS is measured
    started_here: bool = False


@contextmanager
def local_target(
    data_dir: Path,
    *,
    threads_per_node: int | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    ttft_objective_s: float | None = None,
) -> Iterator[Target]:
    """A redis-server and a ready 1-node cluster with auth on, under `data_dir`, its gateway with
    `ttft_objective_s` (admission by predicted wait) when given; stopped on exit."""
    objective = {} if ttft_objective_s is None else {"MOHAWK_TTFT_OBJECTIVE_S": str(ttft_objective_s)}
    redis = RedisServer(
        data_dir / "redis", free_port(), persist=False, log_file=data_dir / "logs" / "redis.log"
    )
    redis.start()
    try:
        spec = ClusterSpec(
            nodes=1,
            port=free_port(),
            nats_port=free_port(),
            data_dir=data_dir,
            threads_per_node=threads_per_node,
            env=CLUSTER_ENV,
            gateway_env={"MOHAWK_REDIS_URL": redis.url, **GATEWAY_ENV, **objective},
        )
        with LocalCluster(spec) as cluster:
            cluster.wait_ready(timeout=ready_timeout_s)
            cluster.wait_pools_resident()  # the node's memory before the load holds its whole KV pool
            servers = {"nats": cluster.nats.process, "redis": redis.process}
            pids = {name: proc.pid for name, proc in cluster.processes.items()}
            pids.update({name: proc.pid for name, proc in servers.items() if proc is not None})
            yield Target(cluster.url, redis.url, pids, started_here=True)
    finally:
        redis.stop()


async def create_tenants(redis_url: str, tenants: Sequence[TenantSpec]) -> dict[str, str]:
    """Each tenant created afresh (replacing one of its name, and its rate-limit buckets); their
    API keys by name."""
    client = connect(redis_url)
    store = TenantStore(client)
    keys = {}
    try:
        for tenant in tenants:
            with suppress(TenantNotFound):
                await store.remove(tenant.name)
            await client.delete(*(limit_key(tenant.name, kind) for kind in BUCKET_KINDS))
            _, keys[tenant.name] = await store.add(
                tenant.name,
                rpm=tenant.rpm,
                tpm=tenant.tpm,
                max_concurrency=tenant.max_concurrency,
                priority=tenant.priority,
                weight=tenant.weight,
            )
    finally:
        await client.aclose()
    return keys


async def remove_tenants(redis_url: str, tenants: Sequence[TenantSpec]) -> None:
    client = connect(redis_url)
    store = TenantStore(client)
    try:
        for tenant in tenants:
            with suppress(TenantNotFound):
                await store.remove(tenant.name)
    finally:
        await client.aclose()


async def warm_up(target: Target, spec: LoadSpec) -> Recorder:
    """A few sessions of one turn and a few chat requests, at once, as the warm-up tenant."""
    warmup = dataclasses.replace(
        spec,
        num_sessions=min(NUM_WARMUP_SESSIONS, spec.num_sessions),
        num_chat_clients=min(NUM_WARMUP_CHATS, spec.num_chat_clients),
        turns_per_session=1,
        chat_requests_per_client=1,
        ramp_s=0.0,
        tenants=(WARMUP_TENANT,),
    )
    keys = await create_tenants(target.redis_url, warmup.tenants)
    recorder = Recorder()
    try:
        await Driver(warmup, target.url, keys, recorder).run()
    finally:
        await remove_tenants(target.redis_url, warmup.tenants)
    return recorder
