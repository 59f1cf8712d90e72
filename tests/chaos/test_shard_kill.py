"""Kill -9 a shard node (stage 0, the middle stage or the last) under 16 greedy streams: every stream
finishes with the text of an undisturbed run.

Real processes: nats-server, a coordinator, three shard nodes and the gateway. When the node dies
its heartbeats stop, the coordinator plans the layers over the two left, and the new stage 0
resumes every request from the tokens the token stream holds; a dead stage 0's requests come
back from the durable stream once their ack wait (10 s) runs out, as it no longer extends it.
Full form only (`make chaos`): each case starts a 3-node cluster and re-plans.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from mohawk_cli.cluster import LocalCluster
from tests.chaos.clusters import chaos_spec
from tests.integration.cluster_helpers import (
    PROMPTS,
    REFERENCE_TOKENS,
    current_plan,
    stream_chat,
)

NUM_STREAMS = 16
BOUND_S = 60.0  # every stream done within this long after the kill


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = chaos_spec(tmp_path_factory.mktemp("chaos-shard"), 3)
    with LocalCluster(spec) as running:
        running.wait_ready(timeout=240)
        yield running


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2], ids=["stage-0", "middle", "last"])
def test_a_killed_shard_node_loses_no_request(
    cluster: LocalCluster, reference: dict[str, str], stage: int
) -> None:
    plan = current_plan(cluster.nats.url)
    assert plan is not None and len(plan.stages) == 3
    victim = plan.stages[stage].node_id

    async def scenario() -> tuple[list[tuple[str, str | None]], float]:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(NUM_STREAMS)]
        async with httpx.AsyncClient(
            base_url=cluster.url, limits=httpx.Limits(max_connections=NUM_STREAMS + 4)
        ) as client:
            tasks = [asyncio.create_task(stream_chat(client, p, REFERENCE_TOKENS)) for p in prompts]
            await asyncio.sleep(1.5)
            cluster.kill(victim)
            killed_at = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=BOUND_S)
            return list(zip(prompts, results, strict=True)), time.monotonic() - killed_at

    done, took = asyncio.run(scenario())
    print(f"\n{victim} (stage {stage}) killed: all {len(done)} streams done {took:.1f} s later")
    for prompt, (text, finish) in done:
        assert finish in ("stop", "length") and text == reference[prompt], prompt
