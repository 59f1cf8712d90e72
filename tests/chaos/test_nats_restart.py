"""Kill -9 nats-server under 16 concurrent greedy streams and start it again: nothing is lost or hangs.

Real processes: nats-server (file storage, so the request and token streams survive), a
coordinator, two shard nodes and the gateway. The server dies while every stream is generating,
stays down `DOWN_S`, and comes back on the same port and data directory. Frames in flight at the
kill are lost; stage 0's step deadlines (`node/step_deadlines.py`) give those steps up and resume
their sequences from the token stream, and the gateway reads back the token events it missed.
Every stream must then finish with exactly the text of an undisturbed run (no duplicate or
missing token) within `BOUND_S` of the restart, and no process may hold more memory than after
the same load undisturbed (`memory.py`). The short form (3 s down) runs in `make test`; the
full form (10 s down, as operators see a restart) in `make chaos`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from mohawk_cli.cluster import LocalCluster
from tests.chaos.clusters import chaos_spec
from tests.chaos.memory import grown, resident_bytes
from tests.integration.cluster_helpers import PROMPTS, REFERENCE_TOKENS, stream_chat

NUM_STREAMS = 16
BOUND_S = 60.0  # every stream done within this long after nats-server is back


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = chaos_spec(tmp_path_factory.mktemp("chaos-nats"), 2, MOHAWK_STEP_DEADLINE_FLOOR_S="2")
    with LocalCluster(spec) as running:
        running.wait_ready(timeout=240)
        yield running


async def _streams_through_a_restart(cluster: LocalCluster, down_s: float) -> tuple[list, float]:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(NUM_STREAMS)]
    limits = httpx.Limits(max_connections=NUM_STREAMS + 4)
    async with httpx.AsyncClient(base_url=cluster.url, limits=limits) as client:
        tasks = [asyncio.create_task(stream_chat(client, p, REFERENCE_TOKENS)) for p in prompts]
        await asyncio.sleep(1.5)  # every stream admitted and generating
        cluster.nats.kill()
        await asyncio.sleep(down_s)
        await asyncio.to_thread(cluster.nats.start)
        back_at = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=BOUND_S)
        took = time.monotonic() - back_at
    return list(zip(prompts, results, strict=True)), took


async def _warm_up(cluster: LocalCluster) -> None:
    limits = httpx.Limits(max_connections=NUM_STREAMS + 4)
    async with httpx.AsyncClient(base_url=cluster.url, limits=limits) as client:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(NUM_STREAMS)]
        await asyncio.gather(*(stream_chat(client, p, REFERENCE_TOKENS) for p in prompts))


def _check(cluster: LocalCluster, reference: dict[str, str], down_s: float) -> None:
    asyncio.run(_warm_up(cluster))  # the same load undisturbed: steady allocations first
    before = resident_bytes(cluster)
    done, took = asyncio.run(_streams_through_a_restart(cluster, down_s))
    print(f"\nnats-server down {down_s:.0f} s: all {len(done)} streams done {took:.1f} s after the restart")
    for prompt, (text, finish) in done:
        assert finish in ("stop", "length"), (prompt, text, finish)
        assert text == reference[prompt], prompt
    for name, proc in cluster.processes.items():
        assert proc.poll() is None, f"{name} exited"
    assert not grown(before, resident_bytes(cluster)), "memory did not come back to its level"


def test_nats_restart_loses_no_request(cluster: LocalCluster, reference: dict[str, str]) -> None:
    _check(cluster, reference, down_s=3.0)


@pytest.mark.slow
@pytest.mark.full_form
def test_nats_restart_after_ten_seconds_loses_no_request(
    cluster: LocalCluster, reference: dict[str, str]
) -> None:
    _check(cluster, reference, down_s=10.0)
