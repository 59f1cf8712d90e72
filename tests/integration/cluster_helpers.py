"""Helpers for tests that run a whole local cluster: bus reads, HTTP streaming, reference generations."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from mohawk_cli.cluster import LocalCluster
from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import read_plan
from mohawk_proto.v1 import bus_pb2

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colours.",
    "Explain gravity in one sentence.",
    "What is 12 times 12?",
    "Say hello in Spanish.",
    "Give me a synonym for happy.",
    "What do bees make?",
]
REFERENCE_TOKENS = 24

# Texts are compared token for token between a single process and a pipeline, which batch the same
# prompts differently, in the default mode: it is batch invariant
# (tests/shard/engine/test_batch_invariance.py).
# A pipeline mixing torch and MLX stages computes with two libraries' kernels: in fp32 weights their
# texts still agree token for token, in the default 4-bit ones they need not.
MIXED_BACKENDS_WEIGHTS = "fp32"


def reference_texts(weights: str | None = None, max_tokens: int = REFERENCE_TOKENS) -> dict[str, str]:
    """Greedy texts of PROMPTS from the single-process torch engine (what `mohawk generate` prints),
    `max_tokens` each, in the default mode unless `weights` names another format."""
    from mohawk_common.chat import encode_chat
    from mohawk_shard.config import EngineSettings
    from mohawk_shard.engine.sampling_params import SamplingParams
    from mohawk_shard.local import build_local_engine

    pinned = {} if weights is None else {"weights": weights}
    engine = build_local_engine(EngineSettings.model_validate({"num_threads": 1, **pinned}))
    prompts = [encode_chat(engine.tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    done = engine.generate(prompts, SamplingParams.create(temperature=0.0, max_tokens=max_tokens))
    return {p: c.text for p, c in zip(PROMPTS, done, strict=True)}


async def _leader_of(url: str, creds: Path | None) -> str | None:
    nc = await connect(url, name="test-probe", attempts=5, creds=creds)
    try:
        entry = await (await nc.jetstream().key_value(names.LEADER_BUCKET)).get(names.LEADER_KEY)
    except Exception:
        return None
    finally:
        await nc.close()
    return entry.value.decode() if entry.value else None


def current_plan(nats_url: str, creds: Path | None = None) -> bus_pb2.Plan | None:
    """The plan in KV (with `creds` where NATS has users: any role may read it)."""

    async def read() -> bus_pb2.Plan | None:
        nc = await connect(nats_url, name="test-probe", attempts=5, creds=creds)
        try:
            return await read_plan(await nc.jetstream().key_value(names.PLAN_BUCKET))
        finally:
            await nc.close()

    return asyncio.run(read())


def wait_for_stages(cluster: LocalCluster, stages: int, timeout: float = 120.0) -> bus_pb2.Plan:
    """The active plan once it has `stages` stages, then the gateway ready on it. On a loaded
    machine a node may first be heard after the coordinator's settle time, so the first plan can
    leave it out; the next one takes it in."""
    creds = cluster.nats_creds("ops")
    deadline = time.monotonic() + timeout
    while True:
        plan = current_plan(cluster.nats.url, creds=creds)
        if plan is not None and len(plan.stages) == stages and plan.state == "active":
            cluster.wait_ready(timeout=max(1.0, deadline - time.monotonic()))
            return plan
        assert time.monotonic() < deadline, f"no active {stages}-stage plan within {timeout:.0f} s: {plan}"
        time.sleep(0.25)


def current_leader(nats_url: str, creds: Path | None = None) -> str | None:
    """The coordinator holding the lease (with `creds` where NATS has users), or None."""
    return asyncio.run(_leader_of(nats_url, creds))


def chat_body(prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def chat(base_url: str, prompt: str, max_tokens: int = 24) -> dict[str, Any]:
    response = httpx.post(f"{base_url}/v1/chat/completions", json=chat_body(prompt, max_tokens), timeout=120)
    response.raise_for_status()
    return dict(response.json())


async def stream_chat(
    client: httpx.AsyncClient,
    prompt: str,
    max_tokens: int = 24,
    on_chunk: Callable[[], None] | None = None,
) -> tuple[str, str | None]:
    """The streamed text and finish reason of one greedy chat completion (`on_chunk` is called as
    each chunk arrives)."""
    parts: list[str] = []
    finish = None
    body = chat_body(prompt, max_tokens, stream=True)
    async with client.stream("POST", "/v1/chat/completions", json=body, timeout=300) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if on_chunk is not None:
                on_chunk()
            for choice in chunk.get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or "")
                finish = choice.get("finish_reason") or finish
    return "".join(parts), finish


def stream_many(base_url: str, prompts: Sequence[str], max_tokens: int) -> list[tuple[str, str | None]]:
    async def run() -> list[tuple[str, str | None]]:
        limits = httpx.Limits(max_connections=len(prompts) + 4)
        async with httpx.AsyncClient(base_url=base_url, limits=limits) as client:
            return list(await asyncio.gather(*(stream_chat(client, p, max_tokens) for p in prompts)))

    return asyncio.run(run())
