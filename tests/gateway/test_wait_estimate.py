"""Admission by predicted wait (`wait_estimate.py`): the wait for a first token is the requests
ahead over the rate first tokens come, priorities keep their order, and a gateway with an objective
refuses (429, Retry-After from the same prediction) what it cannot serve in time, before any work."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import httpx
import pytest

from mohawk_common.bus.server import NatsServer
from mohawk_gateway.wait_estimate import Prediction, WaitEstimate
from tests.gateway.conftest import ServerThread, is_ready, wait_until
from tests.gateway.scripted import ScriptedPipeline

CHAT = "/v1/chat/completions"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_wait_is_the_requests_ahead_over_the_first_token_rate() -> None:
    clock = Clock()
    waits = WaitEstimate(window_s=10.0, clock=clock)
    assert waits.predict("normal").wait_s == 0.0  # nothing ahead: no wait
    for i in range(20):  # 20 first tokens in the last 10 s: 2 a second
        waits.submitted(f"done-{i}", "normal")
        clock.now += 0.5
        waits.first_token(f"done-{i}")
    for i in range(7):
        waits.submitted(f"queued-{i}", "normal")
    predicted = waits.predict("normal")
    assert (predicted.ahead, predicted.rate_per_s) == (7, 2.0)
    assert predicted.wait_s == pytest.approx(4.0)  # (7 + 1) / 2
    assert predicted.retry_after_s(2.0) == 2 and predicted.retry_after_s(10.0) == 1


def test_priorities_keep_their_order_and_ended_requests_stop_counting() -> None:
    clock = Clock()
    waits = WaitEstimate(window_s=10.0, clock=clock)
    for i in range(10):
        waits.submitted(f"r{i}", "normal")
        clock.now += 1.0
        waits.first_token(f"r{i}")  # 1 a second
    for i in range(5):
        waits.submitted(f"low-{i}", "low")
    waits.submitted("normal-0", "normal")
    assert waits.predict("high").ahead == 0  # high waits for no one below it
    assert waits.predict("normal").ahead == 1
    assert waits.predict("low").ahead == 6
    waits.closed("normal-0")  # cancelled before its first token
    assert waits.predict("normal").wait_s == 0.0


def test_with_no_first_token_in_the_window_the_oldest_wait_is_the_estimate() -> None:
    clock = Clock()
    waits = WaitEstimate(window_s=5.0, clock=clock)
    waits.submitted("stuck", "normal")
    clock.now += 7.0
    assert waits.predict("normal") == Prediction(7.0, 1, 0.0)


def _hang(url: str) -> None:
    """A request that gets no token; its client gives up after 3 s (the gateway then cancels it)."""
    body = {"messages": [{"role": "user", "content": "hang"}]}
    with contextlib.suppress(httpx.ReadTimeout), httpx.Client(base_url=url, timeout=3.0) as client:
        client.post(CHAT, json=body)


def test_a_gateway_with_an_objective_refuses_what_it_cannot_serve_in_time_and_says_when_to_retry(
    nats_server: NatsServer,
    pipeline: ScriptedPipeline,
    start_gateway: Callable[..., ServerThread],
) -> None:
    gateway = start_gateway(nats_server.url, ttft_objective_s=0.5)
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        wait_until(lambda: is_ready(client))
        assert client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]}).status_code == 200
        # one request that gets no token: the next is predicted to wait (1 + 1) / the first-token
        # rate, and one first token in the seconds since the gateway started is far below 4 a second
        hung = [threading.Thread(target=_hang, args=(gateway.url,))]
        for thread in hung:
            thread.start()
        try:
            wait_until(lambda: len(pipeline.requests) >= 2)
            wait_until(
                lambda: (
                    client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]}).status_code
                    == 429
                ),
                timeout=10,
            )
            refused = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]})
            assert refused.status_code == 429
            assert refused.headers["x-mohawk-refusal"] == "ttft_objective"
            assert int(refused.headers["retry-after"]) >= 1
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            assert "predicted" in refused.json()["error"]["message"]
            submitted = len(pipeline.requests)
        finally:
            for thread in hung:
                thread.join()
        assert len(pipeline.requests) == submitted  # a refused request never reached the bus
        # the hung requests left (their clients closed): nothing is ahead, requests are served again
        wait_until(
            lambda: (
                client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]}).status_code == 200
            ),
            timeout=10,
        )
        metrics = client.get("/metrics").text
        assert "mohawk_gateway_refused_by_predicted_wait_total" in metrics
