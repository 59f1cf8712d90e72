"""API keys and rate limits at the gateway: a real Redis (tests/redis_server.py), the scripted pipeline.

With auth on every /v1 call needs a tenant's key (401 in OpenAI's shape otherwise); a tenant past
its requests a minute gets 429 with Retry-After and OpenAI's x-ratelimit headers; two gateways on
one Redis share the tenant's limit; the tenant's name, priority and weight travel to stage 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from mohawk_common.bus.server import NatsServer
from mohawk_common.tenancy import TenantStore, connect
from mohawk_proto.v1 import bus_pb2
from tests.gateway.conftest import ServerThread, is_ready, wait_until
from tests.gateway.scripted import ScriptedPipeline

CHAT = {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3}


def add_tenant(redis_url: str, name: str, **limits: Any) -> str:
    async def add() -> str:
        client = connect(redis_url)
        try:
            _, key = await TenantStore(client).add(name, **limits)
        finally:
            await client.aclose()
        return key

    return asyncio.run(add())


@pytest.fixture
def auth_gateway(
    nats_server: NatsServer,
    pipeline: ScriptedPipeline,
    start_gateway: Callable[..., ServerThread],
    redis_url: str,
) -> Iterator[httpx.Client]:
    server = start_gateway(nats_server.url, redis_url=redis_url, auth=True)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        wait_until(lambda: is_ready(client))
        yield client


def test_a_missing_or_wrong_key_is_401_in_openai_shape(auth_gateway: httpx.Client, redis_url: str) -> None:
    missing = auth_gateway.post("/v1/chat/completions", json=CHAT)
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert missing.json()["error"]["type"] == "invalid_request_error"
    wrong = auth_gateway.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer mk-nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert auth_gateway.get("/v1/models").status_code == 401
    assert auth_gateway.get("/health").status_code == 200  # health and metrics stay open
    key = add_tenant(redis_url, "acme")
    ok = auth_gateway.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["message"]["content"] == "Hello world!"


def test_past_its_rpm_a_tenant_gets_429_with_openai_headers(
    auth_gateway: httpx.Client, redis_url: str
) -> None:
    key = add_tenant(redis_url, "small", rpm=2, tpm=10_000)
    headers = {"Authorization": f"Bearer {key}"}
    first = auth_gateway.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-limit-tokens"] == "10000"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) < 10_000
    assert "x-ratelimit-reset-requests" in first.headers
    assert auth_gateway.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
    refused = auth_gateway.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert refused.status_code == 429 and refused.headers["x-mohawk-refusal"] == "tenant_rate_limit"
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    assert "small" in error["message"]


def test_two_gateways_share_one_tenants_limit(
    nats_server: NatsServer,
    pipeline: ScriptedPipeline,
    start_gateway: Callable[..., ServerThread],
    redis_url: str,
) -> None:
    key = add_tenant(redis_url, "shared", rpm=3)
    headers = {"Authorization": f"Bearer {key}"}
    urls = [start_gateway(nats_server.url, redis_url=redis_url, auth=True).url for _ in range(2)]
    clients = [httpx.Client(base_url=url, timeout=10, headers=headers) for url in urls]
    try:
        for client in clients:
            wait_until(lambda client=client: is_ready(client))
        codes = [clients[i % 2].post("/v1/chat/completions", json=CHAT).status_code for i in range(4)]
    finally:
        for client in clients:
            client.close()
    assert codes == [200, 200, 200, 429]


def test_the_tenant_travels_to_stage_0(
    auth_gateway: httpx.Client, pipeline: ScriptedPipeline, redis_url: str
) -> None:
    key = add_tenant(redis_url, "vip", priority="high", weight=3.0)
    answer = auth_gateway.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200
    request = pipeline.requests[-1]
    assert request.tenant == "vip" and request.weight == pytest.approx(3.0)
    assert request.priority == bus_pb2.PRIORITY_HIGH


def test_with_auth_off_a_known_key_still_names_its_tenant(
    nats_server: NatsServer,
    pipeline: ScriptedPipeline,
    start_gateway: Callable[..., ServerThread],
    redis_url: str,
) -> None:
    key = add_tenant(redis_url, "known", rpm=1)
    server = start_gateway(nats_server.url, redis_url=redis_url, auth=False)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        wait_until(lambda: is_ready(client))
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200  # anonymous
        assert (
            client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer x"}).status_code
            == 200
        )
        named = {"Authorization": f"Bearer {key}"}
        assert client.post("/v1/chat/completions", json=CHAT, headers=named).status_code == 200
        assert client.post("/v1/chat/completions", json=CHAT, headers=named).status_code == 429
    assert pipeline.requests[-1].tenant == "known"
    assert pipeline.requests[0].tenant == ""


def test_a_request_without_max_tokens_is_capped_by_the_tpm_and_the_context(
    auth_gateway: httpx.Client, pipeline: ScriptedPipeline, redis_url: str
) -> None:
    """The plan's context is 64 tokens; a tenant of 40 tokens a minute gets at most 40 - prompt."""
    chat = {"messages": [{"role": "user", "content": "hi there"}]}  # no max_tokens
    small = {"Authorization": f"Bearer {add_tenant(redis_url, 'small', tpm=40)}"}
    first = auth_gateway.post("/v1/chat/completions", json=chat, headers=small)
    assert first.status_code == 200, first.text
    request = pipeline.requests[-1]
    num_prompt = len(request.prompt_token_ids)
    assert request.sampling.max_tokens == 40 - num_prompt
    assert first.headers["x-ratelimit-remaining-tokens"] == "0"  # the cap is under the estimate: all of it
    # It used 3 completion tokens and the rest came back; the next one (40 again) waits for 3 + prompt.
    second = auth_gateway.post("/v1/chat/completions", json=chat, headers=small)
    assert second.status_code == 429
    assert int(second.headers["x-ratelimit-remaining-tokens"]) in (40 - num_prompt - 3, 40 - num_prompt - 2)
    large = {"Authorization": f"Bearer {add_tenant(redis_url, 'large', tpm=10_000)}"}
    assert auth_gateway.post("/v1/chat/completions", json=chat, headers=large).status_code == 200
    assert pipeline.requests[-1].sampling.max_tokens == 64 - num_prompt


def test_a_request_without_max_tokens_is_capped_by_what_the_tenants_minute_has_left(
    nats_server: NatsServer,
    pipeline: ScriptedPipeline,
    start_gateway: Callable[..., ServerThread],
    redis_url: str,
) -> None:
    """A tenant of 60 tokens a minute spends prompt + 3 on a request with max_tokens; the next,
    without, is admitted for prompt + 4 (token_estimate) and granted only what the minute has left;
    an explicit max_tokens beyond what is left is 429 with Retry-After."""
    server = start_gateway(nats_server.url, redis_url=redis_url, auth=True, token_estimate=4)
    small = {"Authorization": f"Bearer {add_tenant(redis_url, 'small', tpm=60)}"}
    chat = {"messages": [{"role": "user", "content": "hi there"}]}  # no max_tokens
    with httpx.Client(base_url=server.url, timeout=10) as client:
        wait_until(lambda: is_ready(client))
        assert client.post("/v1/chat/completions", json=CHAT, headers=small).status_code == 200
        num_prompt = len(pipeline.requests[-1].prompt_token_ids)
        left = 60 - num_prompt - 3
        capped = client.post("/v1/chat/completions", json=chat, headers=small)
        assert capped.status_code == 200, capped.text
        assert pipeline.requests[-1].sampling.max_tokens == left - num_prompt  # not 60 - prompt
        assert capped.headers["x-ratelimit-remaining-tokens"] == "0"
        # It generated 3 and was charged prompt + 3: 60 - 2 * (prompt + 3) are left, too few for 50.
        refused = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 50}, headers=small)
        assert refused.status_code == 429 and 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.headers["x-ratelimit-remaining-tokens"] == str(60 - 2 * (num_prompt + 3))


def test_a_tenants_own_ttft_objective_refuses_its_requests_and_not_the_others(
    auth_gateway: httpx.Client, redis_url: str, pipeline: ScriptedPipeline
) -> None:
    """With one of its requests waiting for a token that does not come, a tenant whose objective is
    0.1 s is refused (the gateway's own objective: none); a tenant with no objective is served."""
    strict = {"Authorization": f"Bearer {add_tenant(redis_url, 'strict', ttft_objective_s=0.1)}"}
    relaxed = {"Authorization": f"Bearer {add_tenant(redis_url, 'relaxed')}"}
    assert auth_gateway.post("/v1/chat/completions", json=CHAT, headers=strict).status_code == 200
    hang = {"messages": [{"role": "user", "content": "hang"}], "max_tokens": 3}
    stuck = threading.Thread(target=_give_up, args=(str(auth_gateway.base_url), hang, strict, 3.0))
    stuck.start()
    try:
        wait_until(lambda: len([r for r in pipeline.requests if r.tenant == "strict"]) == 2)
        refused = auth_gateway.post("/v1/chat/completions", json=CHAT, headers=strict)
        assert refused.status_code == 429 and refused.headers["x-mohawk-refusal"] == "ttft_objective"
        assert auth_gateway.post("/v1/chat/completions", json=CHAT, headers=relaxed).status_code == 200
    finally:
        stuck.join()


def _give_up(url: str, body: dict[str, Any], headers: dict[str, str], after_s: float) -> None:
    with contextlib.suppress(httpx.ReadTimeout), httpx.Client(base_url=url, timeout=after_s) as client:
        client.post("/v1/chat/completions", json=body, headers=headers)
