"""Kill -9 one of two gateways under load: its requests are cancelled on the cluster within 10 s, and the
other gateway's streams finish with the text of an undisturbed run.

Real processes: nats-server, a coordinator, two shard nodes and two gateways. Eight short greedy
streams run through gateway 1 and eight long ones (1,000 tokens each, `ignore_eos`) through
gateway 2, which is killed once they all generate. Nobody is left to read gateway 2's tokens:
stage 0 sees its presence key lapse (`node/gateways.py`: TTL 4 s + 3 s grace + a 1 s check) and
cancels its requests, which leave the durable request stream (acked), so the stream is empty
once gateway 1's streams are done, and the survivors hold no more memory than after a warm-up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mohawk_cli.cluster import LocalCluster
from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import free_port
from tests.chaos.clusters import chaos_spec
from tests.chaos.memory import grown, resident_bytes, settled
from tests.integration.cluster_helpers import (
    PROMPTS,
    REFERENCE_TOKENS,
    chat_body,
    stream_chat,
)

BOUND_S = 10.0  # the promise: a dead gateway's requests are cancelled on the cluster within this


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, str]]:
    spec = chaos_spec(tmp_path_factory.mktemp("chaos-gateway"), 2)
    with LocalCluster(spec) as running:
        second = running.start_gateway("gateway-2", free_port())
        running.wait_ready(timeout=240)
        yield running, second


async def _long_stream(client: httpx.AsyncClient, prompt: str, started: asyncio.Event) -> None:
    body = chat_body(prompt, 1000, stream=True, ignore_eos=True)
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, timeout=300) as response:
            async for line in response.aiter_lines():
                if '"content"' in line:
                    started.set()
    except httpx.HTTPError:
        pass  # its gateway was killed


async def _queued_requests(nats_url: str, creds: Path | None) -> int:
    nc = await connect(nats_url, name="test-probe", attempts=3, creds=creds)
    try:
        info = await nc.jetstream().stream_info(names.REQUESTS_STREAM)
        return int(info.state.messages)
    finally:
        await nc.close()


def test_a_killed_gateways_requests_are_cancelled(
    cluster: tuple[LocalCluster, str], reference: dict[str, str]
) -> None:
    running, second_url = cluster

    async def scenario() -> tuple[list[tuple[str, str | None]], float]:
        limits = httpx.Limits(max_connections=24)
        async with (
            httpx.AsyncClient(base_url=running.url, limits=limits) as first,
            httpx.AsyncClient(base_url=second_url, limits=limits) as second,
        ):
            await asyncio.gather(*(stream_chat(first, p, REFERENCE_TOKENS) for p in PROMPTS))  # warm-up
            before.update(resident_bytes(running))
            events = [asyncio.Event() for _ in range(8)]
            doomed = [
                asyncio.create_task(_long_stream(second, p, e)) for p, e in zip(PROMPTS, events, strict=True)
            ]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), timeout=120)
            survivors = asyncio.gather(*(stream_chat(first, p, REFERENCE_TOKENS) for p in PROMPTS))
            running.kill("gateway-2")
            killed_at = time.monotonic()
            done = await asyncio.wait_for(survivors, timeout=120)
            while await _queued_requests(running.nats.url, running.nats_creds("ops")) > 0:
                assert time.monotonic() - killed_at < BOUND_S + 5, "the dead gateway's requests still run"
                await asyncio.sleep(0.25)
            cancelled_after = time.monotonic() - killed_at
            await asyncio.gather(*doomed)
            return done, cancelled_after

    before: dict[str, int] = {}
    done, cancelled_after = asyncio.run(scenario())
    print(f"\ngateway killed: its 8 requests left the cluster {cancelled_after:.1f} s later")
    assert cancelled_after <= BOUND_S
    for prompt, (text, finish) in zip(PROMPTS, done, strict=True):
        assert finish in ("stop", "length") and text == reference[prompt], prompt
    shard_logs = "".join(p.read_text() for p in running.log_dir.glob("shard-*.log"))
    assert shard_logs.count("orphaned request cancelled") == 8
    assert not settled(lambda: grown(before, resident_bytes(running))), (
        "memory did not come back to its level"
    )
