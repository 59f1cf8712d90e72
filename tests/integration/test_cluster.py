"""The whole system over HTTP: gateway → JetStream → coordinator's plan → 3 shard nodes, real processes.

One cluster serves the module (starting one costs tens of seconds on 2 cores); the tests that
change it (leader kill, node join) run last.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from tests.integration.cluster_helpers import (
    PROMPTS,
    chat,
    current_leader,
    current_plan,
    stream_chat,
    stream_many,
)

LEASE_TTL_S = 2.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        nodes=3,
        coordinators=2,
        port=_free_port(),
        nats_port=_free_port(),
        data_dir=tmp_path_factory.mktemp("cluster"),
        env={"MOHAWK_LEASE_TTL_S": str(LEASE_TTL_S)},
        max_payload=256 * 1024,  # a 512-token step's activations (1.2 MB) cross in chunks
    )
    with LocalCluster(spec) as running:
        running.wait_ready(timeout=240)
        yield running


def _free_port() -> int:
    from mohawk_common.bus.server import free_port

    return free_port()


def test_plan_spreads_the_layers_over_three_nodes(cluster: LocalCluster) -> None:
    plan = current_plan(cluster.nats.url)
    assert plan is not None and plan.state == "active"
    ranges = [(s.start, s.end) for s in plan.stages]
    assert len(ranges) == 3 and ranges[0][0] == 0 and ranges[-1][1] == 30
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_greedy_chat_equals_mohawk_generate(cluster: LocalCluster, reference: dict[str, str]) -> None:
    prompt = PROMPTS[0]
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "mohawk"), "generate", "--prompt", prompt, "--max-tokens", "24"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    expected = cli.stdout.rstrip("\n")
    assert expected == reference[prompt]
    body = chat(cluster.url, prompt, 24)
    assert body["choices"][0]["message"]["content"] == expected
    assert body["usage"]["completion_tokens"] == 24 or body["choices"][0]["finish_reason"] == "stop"
    streamed = stream_many(cluster.url, [prompt], 24)[0]
    assert streamed[0] == expected


def test_openai_client_works_unchanged(cluster: LocalCluster, reference: dict[str, str]) -> None:
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused")
    models = [m.id for m in client.models.list()]
    assert "smollm2-135m-instruct" in models
    prompt = PROMPTS[1]
    messages = [{"role": "user", "content": prompt}]
    reply = client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=messages,
        max_tokens=24,
        temperature=0,  # type: ignore[arg-type]
    )
    assert reply.choices[0].message.content == reference[prompt]
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference[prompt]
    assert chunks[-1].usage is not None
    completion = client.completions.create(
        model="smollm2-135m-instruct", prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert completion.choices[0].text
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="smollm2-135m-instruct", messages=[], max_tokens=4)


def test_32_concurrent_streams_each_match_their_solo_run(
    cluster: LocalCluster, reference: dict[str, str]
) -> None:
    prompts = PROMPTS * 4
    results = stream_many(cluster.url, prompts, 24)
    assert len(results) == 32
    for prompt, (text, finish) in zip(prompts, results, strict=True):
        assert finish in ("stop", "length")
        assert text == reference[prompt]


def test_bad_input_gets_openai_errors_from_the_live_gateway(cluster: LocalCluster) -> None:
    url = f"{cluster.url}/v1/chat/completions"
    cases = [
        (b"{not json", 400),
        (b'{"model": "smollm2-135m-instruct", "messages": "hi"}', 400),
        (b'{"model": "smollm2-135m-instruct", "messages": []}', 400),
        (b'{"model": "smollm2-135m-instruct", "messages": [{"role": "user"}], "max_tokens": -1}', 400),
    ]
    for body, status in cases:
        response = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
        assert response.status_code == status, body
        assert "error" in response.json()
    long_prompt = "hello " * 9000
    response = httpx.post(
        url,
        json={"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": long_prompt}]},
        timeout=60,
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_leader_killed_standby_takes_over_and_requests_finish(
    cluster: LocalCluster, reference: dict[str, str]
) -> None:
    leader = current_leader(cluster.nats.url)
    assert leader is not None
    name = next(n for n in cluster.processes if n.startswith("coordinator") and n in leader)
    result: list[tuple[str, str | None]] = []
    request = threading.Thread(target=lambda: result.extend(stream_many(cluster.url, [PROMPTS[2]], 24)))
    request.start()
    time.sleep(0.3)
    cluster.kill(name)
    killed_at = time.monotonic()
    while True:
        now = current_leader(cluster.nats.url)
        if now is not None and name not in now:
            break
        assert time.monotonic() - killed_at < LEASE_TTL_S + 1.5, "no standby took over"
        time.sleep(0.05)
    failover = time.monotonic() - killed_at
    print(f"\nleader failover after kill -9: {failover:.2f} s (lease TTL {LEASE_TTL_S} s)")
    request.join(120)
    assert result and result[0][0] == reference[PROMPTS[2]]
    assert chat(cluster.url, PROMPTS[3])["choices"][0]["message"]["content"] == reference[PROMPTS[3]]


def test_a_node_joining_makes_a_new_plan_and_serving_goes_on(
    cluster: LocalCluster, reference: dict[str, str]
) -> None:
    """Make before break: while the new plan's nodes load their new layer ranges, the old
    pipeline keeps serving (tokens arrive while the new plan is still loading), and no request is
    refused or changed by the switch."""
    before = current_plan(cluster.nats.url)
    assert before is not None
    prompt = PROMPTS[4]
    chunk_times: list[float] = []
    done: list[tuple[str, str | None]] = []
    stop = threading.Event()

    async def back_to_back() -> None:
        async with httpx.AsyncClient(base_url=cluster.url) as client:
            while not stop.is_set():
                done.append(
                    await stream_chat(client, prompt, on_chunk=lambda: chunk_times.append(time.time()))
                )

    thread = threading.Thread(target=lambda: asyncio.run(back_to_back()))
    thread.start()
    time.sleep(0.5)
    old_nodes = [s.node_id for s in before.stages]
    cluster.add_node()
    loading_at = active_at = None
    deadline = time.monotonic() + 120
    while active_at is None:
        plan = current_plan(cluster.nats.url)
        if plan is not None and plan.version > before.version:
            if plan.state == "active":
                active_at = time.time()
            elif loading_at is None:
                loading_at = time.time()
        assert time.monotonic() < deadline, "no new active plan after a node joined"
        time.sleep(0.1)
    time.sleep(1.0)
    stop.set()
    thread.join(180)
    assert plan is not None and len(plan.stages) == 4
    assert loading_at is not None, "the new plan was never seen loading"
    served_while_loading = [t for t in chunk_times if loading_at < t < active_at]
    pause = max((b - a for a, b in itertools.pairwise(chunk_times)), default=0.0)
    print(
        f"\nnode join: new plan loading for {active_at - loading_at:.1f} s, "
        f"{len(served_while_loading)} chunks served meanwhile, longest pause between chunks {pause:.2f} s"
    )
    assert served_while_loading, "no token arrived while the new plan loaded: the old pipeline stopped"
    assert done and all(text == reference[prompt] for text, _ in done), done
    for node in old_nodes:
        log = (cluster.log_dir / f"{node}.log").read_text()
        assert '"next stage loaded while serving"' in log and '"switched to the next stage"' in log, node
    assert chat(cluster.url, PROMPTS[5])["choices"][0]["message"]["content"] == reference[PROMPTS[5]]
    assert Path(cluster.log_dir / "shard-4.log").exists()
