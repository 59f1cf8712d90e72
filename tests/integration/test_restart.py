"""`make up`, Ctrl-C, `make up`: a cluster started again in the same data dir, with the same shape
and with another, is ready only once the new run's plan is active, and 8 concurrent greedy
requests sent the moment /ready says 200 all answer (before, the stored plan of the earlier run
made the gateway ready at once and every request got 503 or 500)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_common.bus.server import free_port
from tests.integration.cluster_helpers import chat_body

PROMPT = "Name three colours."
NUM_REQUESTS = 8
READY_POLL_S = 0.05


def spec(data_dir: Path, nodes: int) -> ClusterSpec:
    return ClusterSpec(nodes=nodes, port=free_port(), nats_port=free_port(), data_dir=data_dir)


def burst_at_ready(cluster: LocalCluster, timeout: float = 240.0) -> list[httpx.Response]:
    """Poll /ready every 50 ms; the moment it says 200, send 8 concurrent greedy requests."""
    deadline = time.monotonic() + timeout
    while not cluster.is_ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"not ready within {timeout:.0f} s; logs in {cluster.log_dir}")
        time.sleep(READY_POLL_S)

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=120) as client:
            body = chat_body(PROMPT, 8)
            return list(
                await asyncio.gather(
                    *(client.post("/v1/chat/completions", json=body) for _ in range(NUM_REQUESTS))
                )
            )

    return asyncio.run(send())


def texts(responses: list[httpx.Response]) -> list[str]:
    assert [r.status_code for r in responses] == [200] * NUM_REQUESTS, [r.text for r in responses]
    return [str(r.json()["choices"][0]["message"]["content"]) for r in responses]


@pytest.mark.slow
def test_restart_in_the_same_data_dir_with_the_same_and_another_shape(tmp_path: Path) -> None:
    with LocalCluster(spec(tmp_path, 2)) as first:
        answers = texts(burst_at_ready(first))
    assert all(answers)
    with LocalCluster(spec(tmp_path, 2)) as again:
        assert texts(burst_at_ready(again)) == answers
    with LocalCluster(spec(tmp_path, 3)) as reshaped:
        assert all(texts(burst_at_ready(reshaped)))
