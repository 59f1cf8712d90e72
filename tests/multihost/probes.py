"""What the tests do from inside a namespace: read the bus as a role, stream chat completions, and
count every streamed token.

Each helper is a coroutine; `in_ns(netns, coro_fn, timeout_s)` runs one in a thread inside a
namespace, so the connections it opens start there and go nowhere else.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from nats.aio.client import Client
from nats.js.errors import ServiceUnavailableError

from mohawk_common.bus import names
from mohawk_common.bus.connect import credential_options
from mohawk_common.bus.control import decode_json
from mohawk_common.bus.nats_tls import client_context
from mohawk_proto.v1 import bus_pb2
from tests.multihost.hosts import MODEL
from tests.multihost.netns import InNetns

T = TypeVar("T")
# a TLS handshake on a 2-core machine busy with three shard nodes can take seconds (nats-server
# allows 5, `nats_tls.HANDSHAKE_TIMEOUT_S`)
CONNECT_TIMEOUT_S = 10


def in_ns(netns: str, coro_fn: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """Run `coro_fn()` on an event loop of its own inside `netns`, at most `timeout_s`."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro_fn(), timeout_s)

    return InNetns(netns, lambda: asyncio.run(bounded())).result(timeout_s + 5)


def start_in_ns(netns: str, coro_fn: Callable[[], Awaitable[T]], timeout_s: float) -> InNetns[T]:
    async def bounded() -> T:
        return await asyncio.wait_for(coro_fn(), timeout_s)

    return InNetns(netns, lambda: asyncio.run(bounded()))


async def connect_as(
    servers: list[str], creds: Path | None, *, name: str, tls_ca: Path | None = None
) -> tuple[Client, list[Exception]]:
    """One try at connecting, as the user of `creds` (None: anonymously), over TLS trusting only
    `tls_ca` (None: no TLS), without reconnecting;
    the client and the list the server's errors (permissions violations) are appended to as they
    come. ConnectionError with the server's words when it refuses."""
    nc = Client()
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    auth: dict[str, Any] = {} if tls_ca is None else {"tls": client_context(tls_ca)}
    if creds is not None:
        auth |= credential_options(creds)
    try:
        await nc.connect(
            servers,
            name=name,
            connect_timeout=CONNECT_TIMEOUT_S,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            error_cb=on_error,
            **auth,
        )
    except Exception as exc:
        said = "; ".join(str(e) for e in errors)
        raise ConnectionError(f"{type(exc).__name__}: {exc}; the server said: {said}") from exc
    return nc, errors


async def read_plan_record(nc: Client) -> tuple[bytes, bus_pb2.Plan] | None:
    """The plan key's raw record (signed as stored) and its parse; None when there is none."""
    kv = await nc.jetstream().key_value(names.PLAN_BUCKET)
    try:
        entry = await kv.get(names.PLAN_KEY)
    except Exception:  # nats-py: KeyNotFoundError, or a deleted key
        return None
    if not entry.value:
        return None
    return entry.value, decode_json(bus_pb2.Plan, entry.value)


async def plan_history(nc: Client, within_s: float = 30.0) -> list[bytes]:
    """Every stored record of the plan key, oldest first (what a reader of the bucket can record).
    JetStream answers "temporarily unavailable" for a while after a host rejoins (its meta group
    catching up): that is asked again, for up to `within_s`."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        try:
            kv = await nc.jetstream().key_value(names.PLAN_BUCKET)
            entries = await kv.history(names.PLAN_KEY)
            return [e.value for e in entries if e.value]
        except ServiceUnavailableError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.5)


async def heartbeats(nc: Client, node_ids: set[str], within_s: float) -> dict[str, bus_pb2.Heartbeat]:
    """The first heartbeat heard from each of `node_ids` within `within_s` (fewer if some are silent)."""
    seen: dict[str, bus_pb2.Heartbeat] = {}
    complete = asyncio.Event()

    async def on_beat(msg: Any) -> None:
        beat = decode_json(bus_pb2.Heartbeat, msg.data)
        if beat.node_id in node_ids and beat.node_id not in seen:
            seen[beat.node_id] = beat
            if set(seen) == node_ids:
                complete.set()

    sub = await nc.subscribe(names.HEARTBEAT_WILDCARD, cb=on_beat)
    try:
        await asyncio.wait_for(complete.wait(), within_s)
    except TimeoutError:
        pass
    finally:
        await sub.unsubscribe()
    return seen


def chat_body(prompt: str, max_tokens: int, *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # every answer is exactly max_tokens long: a duplicate or gap shows
        "logprobs": True,  # one logprobs entry per token: the tokens are counted, not the chunks
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


@dataclass
class Streamed:
    """One streamed completion as the client saw it."""

    prompt: str
    text: str = ""
    num_tokens: int = 0  # logprobs entries received: one per token the gateway streamed
    finish_reason: str | None = None
    completion_tokens: int | None = None  # the final usage chunk's count
    error: str | None = None


@dataclass
class Progress:
    """Tokens streamed so far, per stream, readable from another thread."""

    num_streams: int
    counts: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.counts = [0] * self.num_streams

    def add(self, stream: int) -> None:
        with self.lock:
            self.counts[stream] += 1

    def snapshot(self) -> list[int]:
        with self.lock:
            return list(self.counts)


async def stream_one(
    client: httpx.AsyncClient, prompt: str, max_tokens: int, on_token: Callable[[], None]
) -> Streamed:
    out = Streamed(prompt)
    parts: list[str] = []
    try:
        await _read_stream(client, out, parts, max_tokens, on_token)
    except httpx.HTTPError as exc:  # a stall past the read timeout, a dropped connection
        out.error = f"{type(exc).__name__} after {out.num_tokens} tokens: {exc}"
    out.text = "".join(parts)
    return out


async def _read_stream(
    client: httpx.AsyncClient, out: Streamed, parts: list[str], max_tokens: int, on_token: Callable[[], None]
) -> None:
    body = chat_body(out.prompt, max_tokens, stream=True)
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            out.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')}"
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                out.error = json.dumps(chunk["error"])
            if chunk.get("usage"):
                out.completion_tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or "")
                for _ in (choice.get("logprobs") or {}).get("content") or []:
                    out.num_tokens += 1
                    on_token()
                out.finish_reason = choice.get("finish_reason") or out.finish_reason


async def stream_many(
    base_url: str, prompts: list[str], max_tokens: int, progress: Progress | None = None
) -> list[Streamed]:
    progress = progress or Progress(len(prompts))
    limits = httpx.Limits(max_connections=len(prompts) + 4)
    timeout = httpx.Timeout(30.0, read=120.0)  # a read stalls at most across one recovery
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        return list(
            await asyncio.gather(
                *(
                    stream_one(client, p, max_tokens, functools.partial(progress.add, i))
                    for i, p in enumerate(prompts)
                )
            )
        )


async def ready(base_url: str) -> bool:
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=2) as client:
            return (await client.get("/ready")).status_code == 200
    except httpx.HTTPError:
        return False
