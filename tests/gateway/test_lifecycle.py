"""Readiness, overload, NATS outages, timeouts and cancellation: the gateway answers, never hangs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from mohawk_common.bus.server import NatsServer, free_port
from mohawk_common.bus.setup import BusLimits
from mohawk_gateway.app import create_app
from tests.gateway.conftest import ServerThread, gateway_settings, is_ready, wait_until
from tests.gateway.scripted import ScriptedPipeline

CHAT = "/v1/chat/completions"


def chat(text: str, **fields: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], **fields}


def test_ready_only_once_a_plan_for_this_model_is_active(
    nats_server: NatsServer,
    start_pipeline: Callable[..., ScriptedPipeline],
    start_gateway: Callable[..., ServerThread],
) -> None:
    pipeline = start_pipeline(plan_state=None)
    with httpx.Client(base_url=start_gateway(nats_server.url).url, timeout=10) as client:
        assert client.get("/health").json() == {"status": "ok"}
        wait_until(lambda: "plan" in client.get("/ready").json().get("reason", ""))
        response = client.post(CHAT, json=chat("hi"))
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert response.json()["error"]["type"] == "service_unavailable"

        pipeline.set_plan("loading", version=1)
        wait_until(lambda: "loading" in client.get("/ready").json().get("reason", ""))
        pipeline.set_plan("active", version=2)
        wait_until(lambda: is_ready(client))
        assert client.get("/ready").json()["plan_version"] == 2
        assert client.post(CHAT, json=chat("hi")).status_code == 200


def test_a_plan_change_queues_requests_instead_of_refusing_them(
    nats_server: NatsServer,
    start_pipeline: Callable[..., ScriptedPipeline],
    start_gateway: Callable[..., ServerThread],
) -> None:
    pipeline = start_pipeline()
    gateway = start_gateway(nats_server.url, queue_wait_s=1.0)
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        wait_until(lambda: is_ready(client))
        pipeline.set_plan("loading", version=2)
        wait_until(lambda: "loading" in client.get("/ready").json().get("reason", ""))
        # the stream holds it; a stage 0 that pulls it answers: no 503 during the change
        assert client.post(CHAT, json=chat("hi")).status_code == 200
        started = time.monotonic()
        response = client.post(CHAT, json=chat("hang"))  # no pipeline answers: 503 after the wait
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert "no pipeline became active within 1 s" in response.json()["error"]["message"]
        assert 1.0 <= time.monotonic() - started < 5.0
        wait_until(lambda: len(pipeline.cancelled) == 1)  # and it left the cluster


def test_nats_down_answers_503_at_once(start_gateway: Callable[..., ServerThread]) -> None:
    gateway = start_gateway(f"nats://127.0.0.1:{free_port()}")  # nobody listens there
    with httpx.Client(base_url=gateway.url, timeout=5) as client:
        assert client.get("/health").status_code == 200
        ready = client.get("/ready")
        assert ready.status_code == 503 and "NATS" in ready.json()["reason"]
        started = time.monotonic()
        response = client.post(CHAT, json=chat("hi", stream=True))
        assert response.status_code == 503 and time.monotonic() - started < 1.0
        assert response.json()["error"]["message"].startswith("not ready")
        assert client.get("/v1/models").status_code == 200


def test_nats_lost_after_start_answers_503_quickly(
    nats_server: NatsServer, pipeline: ScriptedPipeline, client: httpx.Client
) -> None:
    nats_server.kill()
    started = time.monotonic()
    wait_until(lambda: client.post(CHAT, json=chat("hi")).status_code == 503, timeout=5)
    assert time.monotonic() - started < 5
    assert client.get("/ready").status_code == 503 and client.get("/health").status_code == 200


def test_full_request_stream_is_429_with_retry_after(
    nats_server: NatsServer,
    start_pipeline: Callable[..., ScriptedPipeline],
    start_gateway: Callable[..., ServerThread],
) -> None:
    pipeline = start_pipeline(limits=BusLimits(max_queued_requests=1))
    gateway = start_gateway(nats_server.url, max_queued_requests=1, retry_after_s=2)
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        wait_until(lambda: is_ready(client))
        stuck = threading.Thread(target=_post_and_give_up, args=(gateway.url, chat("hang"), 1.5))
        stuck.start()
        wait_until(lambda: len(pipeline.requests) == 1)
        response = client.post(CHAT, json=chat("hi"))
        assert response.status_code == 429 and response.headers["retry-after"] == "2"
        assert response.headers["x-mohawk-refusal"] == "queue_full"
        assert response.json()["error"]["code"] == "rate_limit_exceeded"
        stuck.join()
        wait_until(lambda: pipeline.requests[0].request_id in pipeline.cancelled)
        wait_until(lambda: client.post(CHAT, json=chat("hi")).status_code == 200)


def _post_and_give_up(url: str, body: dict[str, object], after_s: float) -> None:
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=url, timeout=after_s) as client:
        client.post(CHAT, json=body)


@pytest.mark.parametrize("stream", [False, True])
def test_client_that_leaves_before_the_first_token_cancels(
    gateway: ServerThread, client: httpx.Client, pipeline: ScriptedPipeline, stream: bool
) -> None:
    _post_and_give_up(gateway.url, chat("hang", stream=stream), 0.5)
    wait_until(lambda: len(pipeline.cancelled) == 1)
    assert pipeline.cancelled == [pipeline.requests[0].request_id]
    wait_until(lambda: 'mohawk_gateway_cancelled_requests_total{reason="disconnect"} 1.0' in _metrics(client))


def test_client_that_leaves_mid_stream_cancels(client: httpx.Client, pipeline: ScriptedPipeline) -> None:
    with client.stream("POST", CHAT, json=chat("slow", stream=True)) as response:
        lines = response.iter_lines()
        received = [line for _, line in zip(range(6), lines, strict=False)]
    assert any("w1" in line for line in received)
    wait_until(lambda: pipeline.cancelled == [pipeline.requests[0].request_id])
    assert 'mohawk_gateway_requests_in_flight{endpoint="chat"} 0.0' in _metrics(client)


def test_request_timeout_is_504_and_cancels(
    nats_server: NatsServer, pipeline: ScriptedPipeline, start_gateway: Callable[..., ServerThread]
) -> None:
    gateway = start_gateway(nats_server.url, request_timeout_s=0.5)
    with httpx.Client(base_url=gateway.url, timeout=5) as client:
        wait_until(lambda: is_ready(client))
        response = client.post(CHAT, json=chat("hang"))
        assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
    wait_until(lambda: pipeline.cancelled == [pipeline.requests[0].request_id])


def test_finished_requests_are_not_cancelled(client: httpx.Client, pipeline: ScriptedPipeline) -> None:
    assert client.post(CHAT, json=chat("hi")).status_code == 200
    with client.stream("POST", CHAT, json=chat("hi", stream=True)) as response:
        response.read()
    time.sleep(0.2)
    assert pipeline.cancelled == []


def test_metrics_count_requests_tokens_and_first_token_time(client: httpx.Client) -> None:
    client.post(CHAT, json=chat("hi"))
    client.post(CHAT, json={"messages": []})
    text = _metrics(client)
    assert 'mohawk_gateway_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0' in text
    assert 'mohawk_gateway_requests_total{endpoint="/v1/chat/completions",status="400"} 1.0' in text
    assert 'mohawk_gateway_generated_tokens_total{endpoint="chat"} 3.0' in text
    assert 'mohawk_gateway_time_to_first_token_seconds_count{endpoint="chat"} 1.0' in text
    assert 'mohawk_gateway_requests_in_flight{endpoint="chat"} 0.0' in text
    assert "mohawk_gateway_duplicate_token_events_total 2.0" in text


def _metrics(client: httpx.Client) -> str:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return response.text


def _counter(client: httpx.Client, name: str) -> float:
    line = next(x for x in _metrics(client).splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


def test_in_flight_cap_is_429(
    nats_server: NatsServer, pipeline: ScriptedPipeline, start_gateway: Callable[..., ServerThread]
) -> None:
    gateway = start_gateway(nats_server.url, max_in_flight=1)
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        wait_until(lambda: is_ready(client))
        stuck = threading.Thread(target=_post_and_give_up, args=(gateway.url, chat("hang"), 1.0))
        stuck.start()
        wait_until(lambda: len(pipeline.requests) == 1)
        tokenized = _counter(client, "mohawk_gateway_prompts_tokenized_total")
        response = client.post(CHAT, json=chat("word " * 10_000))  # refused before tokenizing
        assert response.status_code == 429 and response.headers["retry-after"] == "1"
        assert response.json()["error"]["code"] == "rate_limit_exceeded"
        assert _counter(client, "mohawk_gateway_prompts_tokenized_total") == tokenized
        # its body was read and dropped, so the keep-alive connection serves the retry; a body of
        # no declared length is left unread, and that connection is closed
        assert response.headers.get("connection") != "close"
        chunked = client.post(CHAT, content=iter([b'{"messages": [', b"]}"]))
        assert chunked.status_code == 429 and chunked.headers["connection"] == "close"
        stuck.join()
        wait_until(lambda: client.post(CHAT, json=chat("hi")).status_code == 200)


def test_a_tokenizer_that_cannot_load_keeps_the_gateway_unready(
    nats_server: NatsServer, pipeline: ScriptedPipeline, tmp_path: Path
) -> None:
    server = ServerThread(create_app(gateway_settings(nats_server.url, model=str(tmp_path)))).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            wait_until(
                lambda: "tokenizer could not be loaded" in client.get("/ready").json().get("reason", "")
            )
            assert client.get("/health").status_code == 200
            response = client.post(CHAT, json=chat("hi"))
            assert response.status_code == 503 and "tokenizer" in response.json()["error"]["message"]
    finally:
        server.stop()
