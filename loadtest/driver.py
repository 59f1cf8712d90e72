"""The clients: N sessions and M chat loops, started evenly over the ramp, each on its own connection.

Design. Each session is one task: create it (`POST /v1/sessions`), send its turns one after the
other, each streamed (`POST /v1/sessions/{id}/infer`), then delete it. A turn that fails ends the
session, since its history is no longer what the client thinks; the turns it never sent are
counted by tenant (`Recorder.not_sent`). Each chat client is one task that sends its requests one
after the other as streamed `/v1/chat/completions` with usage (a failed one does not stop it).
Every generation asks for exactly `tokens_per_turn` tokens (`ignore_eos`, greedy), so the tenants'
shares measure the scheduler, not where the model chose to stop. Every task has an httpx client
of its own with one connection, so no request ever waits for one. One client pooling a connection
per task cost the generator more than the gateway: httpcore's pool walks all its connections (and
polls each idle one's socket) on every request and release, so at 1,050 connections the
generator spent most of a core on it and read its sockets tens of seconds late, which the run
counted as time to first token (see docs/benchmarks.md). The tasks share one TLS context, which
is costly to build.
"""

from __future__ import annotations

import asyncio
import functools
import random
import ssl
from collections.abc import Mapping
from typing import Any

import httpx

from loadtest.measure import Recorder, RequestKind, RequestLog
from loadtest.spec import LoadSpec, TenantSpec
from loadtest.stream import Call, send

TOPICS = (
    "the sea",
    "bees",
    "the moon",
    "bread",
    "rivers",
    "owls",
    "glass",
    "maps",
    "volcanoes",
    "tea",
    "clocks",
    "salt",
)
CONNECT_TIMEOUT_S = 30.0


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def make_client(url: str, spec: LoadSpec) -> httpx.AsyncClient:
    """One task's client: one connection, the stall timeout as its read timeout."""
    return httpx.AsyncClient(
        base_url=url,
        verify=_tls_context(),
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        timeout=httpx.Timeout(spec.stall_timeout_s, connect=CONNECT_TIMEOUT_S, pool=None),
    )


def generation_fields(spec: LoadSpec) -> dict[str, Any]:
    return {
        "max_tokens": spec.tokens_per_turn,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class Driver:
    def __init__(
        self,
        spec: LoadSpec,
        url: str,
        api_keys: Mapping[str, str],
        recorder: Recorder,
        *,
        seed: int = 0,
    ) -> None:
        self.spec = spec
        self.url = url
        self.api_keys = api_keys
        self.recorder = recorder
        self.rng = random.Random(seed)

    async def run(self) -> None:
        """Every session and chat client, to the end of its last request."""
        spec = self.spec
        sessions = [
            self._session(i, spec.ramp_s * i / max(1, spec.num_sessions)) for i in range(spec.num_sessions)
        ]
        clients = [
            self._chat_client(j, spec.ramp_s * j / max(1, spec.num_chat_clients))
            for j in range(spec.num_chat_clients)
        ]
        await asyncio.gather(*sessions, *clients)

    async def _send(
        self, client: httpx.AsyncClient, tenant: TenantSpec, kind: RequestKind, call: Call
    ) -> tuple[RequestLog, dict[str, Any] | None]:
        log = self.recorder.begin(tenant.name, kind)
        body = await send(
            client,
            self.recorder,
            log,
            call,
            api_key=self.api_keys[tenant.name],
            max_wait_s=self.spec.max_retry_wait_s,
            rng=self.rng,
        )
        return log, body

    async def _session(self, index: int, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        async with make_client(self.url, self.spec) as client:
            await self._session_turns(client, index)

    async def _session_turns(self, client: httpx.AsyncClient, index: int) -> None:
        spec, tenant = self.spec, self.spec.tenant_of_session(index)
        opening = {
            "qos": {"priority": tenant.priority, "max_tokens_per_turn": spec.tokens_per_turn},
            "routing": {"affinity": True},
            "system_prompt": spec.system_prompt,
        }
        log, created = await self._send(
            client, tenant, "session.create", Call("POST", "/v1/sessions", opening)
        )
        session_id = created.get("id") if created else None
        if not isinstance(session_id, str):
            if log.ok:
                log.error = "bad_answer"  # 201 without an id
            self.recorder.not_sent[tenant.name] += spec.turns_per_session
            return
        for turn in range(spec.turns_per_session):
            topic = TOPICS[(index + turn) % len(TOPICS)]
            body = {
                "input": f"Session {index}, question {turn + 1}: tell me about {topic}.",
                **generation_fields(spec),
            }
            log, _ = await self._send(
                client,
                tenant,
                "session.turn",
                Call("POST", f"/v1/sessions/{session_id}/infer", body, stream=True),
            )
            if not log.ok:
                self.recorder.not_sent[tenant.name] += spec.turns_per_session - turn - 1
                break
        await self._send(client, tenant, "session.delete", Call("DELETE", f"/v1/sessions/{session_id}"))

    async def _chat_client(self, index: int, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        async with make_client(self.url, self.spec) as client:
            await self._chat_requests(client, index)

    async def _chat_requests(self, client: httpx.AsyncClient, index: int) -> None:
        spec, tenant = self.spec, self.spec.tenant_of_client(index)
        for request in range(spec.chat_requests_per_client):
            topic = TOPICS[(index + request) % len(TOPICS)]
            messages = [
                {"role": "system", "content": spec.system_prompt},
                {"role": "user", "content": f"Client {index}, request {request + 1}: describe {topic}."},
            ]
            body = {"messages": messages, **generation_fields(spec)}
            await self._send(client, tenant, "chat", Call("POST", "/v1/chat/completions", body, stream=True))
