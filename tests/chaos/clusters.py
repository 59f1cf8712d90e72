"""The clusters the chaos tests break: real processes with `mohawk up`'s defaults (batch invariant:
a re-batched recompute gives the undisturbed run's text exactly; the shard nodes share the host's
cores by turns, so their thread counts change from step to step)."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_common.bus.server import free_port
from mohawk_proto.v1 import bus_pb2
from tests.integration.cluster_helpers import PROMPTS, REFERENCE_TOKENS, current_plan, stream_chat

Outcome = tuple[str, tuple[str, str | None]]  # prompt, (text, finish reason)
FIRST_TEXT_CHUNKS = 2  # a stream's role chunk, then its first text


def chaos_spec(data_dir: Path, nodes: int, coordinators: int = 1, **env: str) -> ClusterSpec:
    """`nodes` shard nodes, the coordinators, the gateway, NATS on free ports; `env` on top."""
    return ClusterSpec(
        nodes=nodes,
        coordinators=coordinators,
        port=free_port(),
        nats_port=free_port(),
        data_dir=data_dir,
        env=env,
        max_payload=256 * 1024,  # a 512-token step's activations cross in chunks
        nats_auth=True,  # a user per process, as `mohawk up` runs: the coordinator hears departures
    )


@contextmanager
def started_cluster(
    tmp_path_factory: pytest.TempPathFactory, name: str, nodes: int, **env: str
) -> Iterator[LocalCluster]:
    """A `chaos_spec` cluster of `nodes` shard nodes under a fresh `name` directory, ready."""
    with LocalCluster(chaos_spec(tmp_path_factory.mktemp(name), nodes, **env)) as running:
        running.wait_ready(timeout=240)
        yield running


def streams_through(
    cluster: LocalCluster,
    fault: Callable[[], Awaitable[None] | None],
    num_streams: int,
    bound_s: float = 60.0,
    settle_s: float = 0.0,
    max_tokens: int = REFERENCE_TOKENS,
    stalls: list[float] | None = None,
    across: list[float] | None = None,
    after: list[float] | None = None,
) -> tuple[list[Outcome], float]:
    """`num_streams` greedy streams of the reference prompts, `max_tokens` each; `fault()` (awaited
    when it returns an awaitable) as soon as every stream has its first text, or `settle_s` later, so it lands
    mid-answer (asserted for at least half of them: a fault after the answers tests nothing). Every outcome,
    and how long after the fault was done the last stream finished; `stalls`, when given, gets each
    stream's longest wait between two chunks (what a reader of the stream saw of the fault, and of
    the first answers' prefills beside it), `across` the wait between the chunks either side of
    the fault (what the reader saw: the wait before the fault, up to a step under the first
    answers' prefills, and the fault's cost), and `after` the wait from the fault to the next chunk
    (the fault's own cost)."""

    async def scenario() -> tuple[list[Outcome], float]:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(num_streams)]
        chunks = [0] * num_streams
        arrivals: list[list[float]] = [[] for _ in range(num_streams)]

        def counter(i: int) -> Callable[[], None]:
            def count() -> None:
                chunks[i] += 1
                arrivals[i].append(time.monotonic())

            return count

        limits = httpx.Limits(max_connections=num_streams + 4)
        async with httpx.AsyncClient(base_url=cluster.url, limits=limits) as client:
            tasks = [
                asyncio.create_task(stream_chat(client, p, max_tokens, counter(i)))
                for i, p in enumerate(prompts)
            ]
            async with asyncio.timeout(bound_s):
                while min(chunks) < FIRST_TEXT_CHUNKS:
                    failed = next((t for t in tasks if t.done() and t.exception() is not None), None)
                    if failed is not None:  # refused or broken before its first text: say why now
                        await failed
                    await asyncio.sleep(0.01)
            await asyncio.sleep(settle_s)
            finished = sum(task.done() for task in tasks)
            struck_at = time.monotonic()
            outcome = fault()
            if inspect.isawaitable(outcome):
                await outcome
            fault_at = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=bound_s)
            if stalls is not None:
                stalls.extend(max((b - a for a, b in pairwise(times)), default=0.0) for times in arrivals)
            if across is not None:
                across.extend(
                    next((b - a for a, b in pairwise(times) if a <= struck_at < b), 0.0) for times in arrivals
                )
            if after is not None:
                after.extend(next((t - struck_at for t in times if t > struck_at), 0.0) for times in arrivals)
            # a short answer ("Paris.") may be done already; a fault after most answers tests little
            assert finished <= num_streams // 2, f"{finished} of {num_streams} streams done before the fault"
            return list(zip(prompts, results, strict=True)), time.monotonic() - fault_at

    return asyncio.run(scenario())


def assert_identical(outcomes: list[Outcome], reference: dict[str, str]) -> None:
    """Every stream finished, with the undisturbed run's text."""
    for prompt, (text, finish) in outcomes:
        assert finish in ("stop", "length"), (prompt, text, finish)
        assert text == reference[prompt], prompt


def events(cluster: LocalCluster, name: str, event: str) -> list[dict[str, Any]]:
    """The log lines of child `name` that record `event`, parsed."""
    lines = (cluster.log_dir / f"{name}.log").read_text().splitlines()
    parsed = (json.loads(line) for line in lines if line.startswith("{"))
    return [e for e in parsed if e.get("event") == event]


def logged_at(entry: dict[str, Any]) -> float:
    """A log line's time, unix seconds."""
    return datetime.fromisoformat(entry["timestamp"]).timestamp()


@dataclass
class TimedKill:
    """`kill -9` of child `name` as a fault, remembering when (unix seconds) it came."""

    cluster: LocalCluster
    name: str
    at: float = 0.0

    def __call__(self) -> None:
        self.at = time.time()
        self.cluster.kill(self.name)


def standby_held_for(cluster: LocalCluster, victim: str, timeout: float) -> tuple[bus_pb2.Plan, str]:
    """The plan and the node holding `victim`'s layers warm, once that node reports them loaded
    (standbys load once the pipeline is active)."""
    deadline = time.monotonic() + timeout
    while True:
        plan = current_plan(cluster.nats.url, cluster.nats_creds("ops"))
        covering = [b for b in plan.standbys if b.covers == victim] if plan is not None else []
        if plan is not None and covering and events(cluster, covering[0].node_id, "standby loaded"):
            return plan, covering[0].node_id
        assert time.monotonic() < deadline, f"no standby held for {victim}'s layers: {plan}"
        time.sleep(0.25)
