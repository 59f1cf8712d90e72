"""No internal error text reaches a client: a Redis or NATS failure is answered with what failed, in
words fit for a client, while the exception's text (hosts, ports) goes to the gateway's log only."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError

from mohawk_cli.redis_server import RedisServer
from mohawk_common.bus import names
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import ensure_streams
from mohawk_gateway.errors import unavailable_after
from tests.gateway.conftest import ServerThread, is_ready, wait_until
from tests.gateway.scripted import ScriptedPipeline
from tests.gateway.test_tenants import CHAT, add_tenant

DETAIL = "Error 111 connecting to 10.1.2.3:6379. Connection refused."


def test_the_detail_goes_to_the_log_and_the_client_gets_what_failed() -> None:
    with structlog.testing.capture_logs() as logs:
        error = unavailable_after("the session store is unreachable", RedisConnectionError(DETAIL), 2)
    assert error.status == 503 and error.headers == {"Retry-After": "2"}
    body = error.body()["error"]
    assert body["message"] == "the session store is unreachable; retry later"
    assert "10.1.2.3" not in str(error.body()) and "6379" not in str(error.body())
    logged = [(entry["event"], entry["error"]) for entry in logs]
    assert logged == [("the session store is unreachable", DETAIL)]


def test_with_redis_down_no_answer_names_its_host_or_port(
    nats_server: NatsServer,
    pipeline: ScriptedPipeline,
    start_gateway: Callable[..., ServerThread],
    redis_server: RedisServer,
    redis_url: str,
) -> None:
    key = add_tenant(redis_url, "acme")
    server = start_gateway(nats_server.url, redis_url=redis_url, auth=True)
    address = urlsplit(redis_url)
    secrets = {address.hostname or "", str(address.port), "Error", "Connect call failed"}
    with httpx.Client(base_url=server.url, timeout=10) as client:
        wait_until(lambda: is_ready(client))
        seen = {"Authorization": f"Bearer {key}"}
        assert client.post("/v1/chat/completions", json=CHAT, headers=seen).status_code == 200
        redis_server.kill()
        answers = [
            client.post("/v1/sessions", json={}, headers=seen),  # a known key, then the session store
            client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer mk-unseen"}),
        ]
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["type"] == "service_unavailable"
        leaked = [secret for secret in secrets if secret and secret in answer.text]
        assert not leaked, answer.text


def test_a_request_nats_does_not_take_is_503_without_nats_own_words(
    client: httpx.Client, pipeline: ScriptedPipeline
) -> None:
    """With the requests stream gone, JetStream answers the publish with its own error text."""

    async def delete_stream() -> None:
        await pipeline._js.delete_stream(names.REQUESTS_STREAM)

    pipeline.call(delete_stream())
    try:
        answer = client.post("/v1/chat/completions", json=CHAT)
    finally:  # the pipeline's pull loop and teardown find their stream again
        pipeline.call(ensure_streams(pipeline._js, pipeline.limits))
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["message"] == "the request could not be queued; retry later"
    assert "nats" not in answer.text.lower() and names.REQUESTS_STREAM not in answer.text
