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
from mohawk_gateway.wait_estimate import (
    CALIBRATION_QUANTILE,
    MIN_CALIBRATION_SAMPLES,
    OBJECTIVE_SHARE,
    RECENT_S,
    Prediction,
    WaitEstimate,
)
from tests.gateway.conftest import ServerThread, is_ready, wait_until
from tests.gateway.scripted import ScriptedPipeline

CHAT = "/v1/chat/completions"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def served(waits: WaitEstimate, clock: Clock, tenant: str, count: int, every_s: float) -> None:
    """`count` requests of `tenant`, each getting its first token `every_s` after the last."""
    for i in range(count):
        waits.submitted(f"{tenant}-done-{i}", tenant, 1.0, "normal")
        clock.now += every_s
        waits.first_token(f"{tenant}-done-{i}")


def test_the_wait_is_the_requests_ahead_over_the_first_token_rate() -> None:
    clock = Clock()
    waits = WaitEstimate(window_s=10.0, clock=clock)
    assert waits.predict("", 1.0, "normal").wait_s == 0.0  # no rate yet, nothing ahead
    served(waits, clock, "", 20, 0.5)  # 20 first tokens in the last 10 s: 2 a second
    for i in range(7):
        waits.submitted(f"queued-{i}", "", 1.0, "normal")
    predicted = waits.predict("", 1.0, "normal")
    assert (predicted.ahead, predicted.rate_per_s) == (7, 2.0)
    assert predicted.wait_s == pytest.approx(3.5)  # 7 / 2
    assert predicted.drain_interval_s == pytest.approx(0.5)


def test_an_admitted_request_counts_before_it_is_submitted_and_then_once() -> None:
    """Clients back together after the same Retry-After: each one admitted raises the next's wait."""
    clock = Clock()
    waits = WaitEstimate(window_s=10.0, clock=clock)
    served(waits, clock, "", 10, 1.0)  # 1 a second
    assert waits.predict("", 1.0, "normal").wait_s == 0.0
    waits.admit("", 1.0, "normal")
    assert waits.predict("", 1.0, "normal").wait_s == pytest.approx(1.0)
    waits.submitted("r", "", 1.0, "normal")  # the admitted one, now on the bus: still one
    assert waits.predict("", 1.0, "normal").ahead == 1
    waits.admit("", 1.0, "normal")  # admitted, then refused or failed before its submission
    clock.now += 11.0
    assert waits.predict("", 1.0, "normal").ahead == 1  # the stale admission no longer counts


def test_priorities_keep_their_order_and_each_tenant_waits_for_its_own_queue_at_its_share() -> None:
    clock = Clock()
    waits = WaitEstimate(window_s=10.0, clock=clock)
    served(waits, clock, "gold", 10, 1.0)  # 1 a second, all gold's
    for i in range(6):
        waits.submitted(f"gold-{i}", "gold", 3.0, "normal")
    waits.submitted("bronze-0", "bronze", 1.0, "normal")
    waits.submitted("low-0", "gold", 3.0, "low")
    assert waits.predict("vip", 1.0, "high").ahead == 0  # high waits for no one below it
    # each waits for its own at its weight's share of the rate (1/s) beside the other: gold's 6
    # at 3 of 4 (0.75/s): 8 s; bronze's 1 at 1 of 4 (0.25/s): 4 s; a new tenant has nothing of
    # its own ahead
    assert waits.predict("gold", 3.0, "normal").wait_s == pytest.approx(8.0)
    assert waits.predict("bronze", 1.0, "normal").wait_s == pytest.approx(4.0)
    assert waits.predict("new", 1.0, "normal").wait_s == 0.0
    # low waits for every normal request first, at the whole rate, then its own
    assert waits.predict("gold", 3.0, "low").ahead == 8
    waits.closed("bronze-0")  # cancelled before its first token
    assert waits.predict("bronze", 1.0, "normal").ahead == 0


def test_a_tenant_alone_in_the_queue_is_judged_at_its_share_beside_tenants_served_just_before() -> None:
    """Bronze had most of the rate (2/s) but gold got a first token a moment ago: gold's clients
    may be back at any time and take their weight's share first, so bronze's 4 are predicted at 1
    of gold 3 + bronze 1 (0.5/s): 8 s, not 2 s. Once gold was last served longer ago than
    RECENT_S, bronze is judged alone, at the whole rate."""
    clock = Clock()
    waits = WaitEstimate(window_s=10.0, clock=clock)
    for i in range(20):
        tenant, weight = ("gold", 3.0) if i == 19 else ("bronze", 1.0)
        waits.submitted(f"done-{i}", tenant, weight, "normal")
        clock.now += 0.5
        waits.first_token(f"done-{i}")
    for i in range(4):
        waits.submitted(f"bronze-{i}", "bronze", 1.0, "normal")
    predicted = waits.predict("bronze", 1.0, "normal")
    assert predicted.rate_per_s == pytest.approx(0.5)
    assert predicted.wait_s == pytest.approx(8.0)
    clock.now += RECENT_S + 0.1  # the window now holds 10 first tokens in 10 s: 1/s, all bronze's
    assert waits.predict("bronze", 1.0, "normal").rate_per_s == pytest.approx(1.0)


def test_what_a_tenants_requests_waited_lately_is_a_floor_while_it_has_requests_ahead() -> None:
    clock = Clock()
    waits = WaitEstimate(window_s=30.0, clock=clock)
    for i in range(10):  # 10 first tokens, each 8 s after its admission
        waits.submitted(f"slow-{i}", "t", 1.0, "normal")
    clock.now += 8.0
    for i in range(10):
        waits.first_token(f"slow-{i}")
    waits.submitted("next", "t", 1.0, "normal")
    assert waits.predict("t", 1.0, "normal").wait_s == pytest.approx(8.0)  # not 1 / (10 / 8 s)
    assert waits.predict("other", 1.0, "normal").wait_s == 0.0  # nothing of its own ahead
    clock.now += 6.0  # the measured waits are older than RECENT_S: the model alone again
    assert waits.predict("t", 1.0, "normal").wait_s < 8.0


def test_with_no_first_token_in_the_window_the_wait_is_at_least_those_ahead_times_the_oldest_age() -> None:
    """None came in the oldest's 7 s: the rate is under 1/7 a second, so 3 ahead wait over 21 s."""
    clock = Clock()
    waits = WaitEstimate(window_s=5.0, clock=clock)
    waits.submitted("stuck", "", 1.0, "normal")
    clock.now += 7.0
    assert waits.predict("", 1.0, "normal") == Prediction(7.0, 1, 0.0)
    waits.admit("", 1.0, "normal")
    waits.admit("", 1.0, "normal")
    predicted = waits.predict("", 1.0, "normal")
    assert predicted == Prediction(21.0, 3, 0.0)
    assert predicted.drain_interval_s == pytest.approx(7.0)


def test_a_request_is_admitted_within_a_share_of_its_objective() -> None:
    """The headroom: a 5 s objective admits a prediction of 3 s and refuses one of 4 s."""
    assert pytest.approx(0.6) == OBJECTIVE_SHARE
    assert WaitEstimate.admits(Prediction(3.0, 6, 2.0), 5.0)
    assert not WaitEstimate.admits(Prediction(4.0, 8, 2.0), 5.0)


def test_the_refused_are_told_to_come_back_one_drain_interval_apart() -> None:
    """10 queued at 2 first tokens a second, an objective that admits 2 s: the first refused comes
    back when the queue is down to 2 s (3 s), each next one half a second later, never past a
    minute; the refused of another tenant queue on their own; once the times told have passed, it
    starts over."""
    clock = Clock()
    waits = WaitEstimate(window_s=10.0, clock=clock)
    served(waits, clock, "", 20, 0.5)
    for i in range(10):
        waits.submitted(f"queued-{i}", "", 1.0, "normal")
    predicted = waits.predict("", 1.0, "normal")
    assert predicted.wait_s == pytest.approx(5.0)
    objective = 2.0 / OBJECTIVE_SHARE  # admits waits up to 2 s
    told = [waits.refuse("", predicted, objective) for _ in range(4)]
    assert told == [3, 4, 4, 5]  # 3, 3.5, 4, 4.5 s, rounded up
    assert waits.refuse("other", predicted, objective) == 3
    assert max(waits.refuse("", predicted, objective) for _ in range(200)) == 60
    clock.now += 61.0
    assert waits.refuse("", predicted, objective) == 3
    clock.now += 61.0
    assert waits.refuse("", predicted, 10.0) == 1  # within the objective already (on a stale figure): 1 s


def test_the_model_is_scaled_by_how_far_off_it_was_lately() -> None:
    """Requests admitted on a 2 s prediction got their first token after 6 s: the next prediction is
    three times the model's; a model that was right is left alone; too few samples change nothing."""
    clock = Clock()
    waits = WaitEstimate(window_s=30.0, clock=clock)
    served(waits, clock, "", 20, 0.5)  # 2 a second
    for i in range(4):
        waits.submitted(f"queued-{i}", "", 1.0, "normal")
    assert waits.calibration() == 1.0
    for i in range(MIN_CALIBRATION_SAMPLES):
        predicted = waits.predict("", 1.0, "normal")
        waits.admit("", 1.0, "normal", predicted)
        waits.submitted(f"late-{i}", "", 1.0, "normal")
    first_model_s = 2.0
    clock.now += 3 * first_model_s  # some waited 6 s on a 2 s prediction, the later ones less
    for i in range(MIN_CALIBRATION_SAMPLES):
        waits.first_token(f"late-{i}")
    ratios = sorted(6.0 / (first_model_s + i * 0.5) for i in range(MIN_CALIBRATION_SAMPLES))
    assert waits.calibration("") == pytest.approx(ratios[int(CALIBRATION_QUANTILE * len(ratios))])
    assert waits.calibration("") > 1.0
    assert waits.calibration("new") == waits.calibration("")  # none of its own: everyone's
    predicted = waits.predict("", 1.0, "normal")
    assert predicted.model_s is not None
    assert predicted.wait_s >= predicted.model_s * waits.calibration("") - 1e-9


def test_requests_still_waiting_past_their_prediction_count_before_their_first_token() -> None:
    """10 admitted on a 1 s prediction and still waiting 3 s later: the model is at least 3 times
    too optimistic, known now; requests not yet past their prediction say nothing."""
    clock = Clock()
    waits = WaitEstimate(window_s=30.0, clock=clock)
    served(waits, clock, "", 20, 0.5)
    for i in range(MIN_CALIBRATION_SAMPLES):
        waits.admit("", 1.0, "normal", Prediction(1.0, 2, 2.0))
        waits.submitted(f"late-{i}", "", 1.0, "normal")
    clock.now += 0.9
    assert waits.calibration("") == 1.0
    clock.now += 2.1
    assert waits.calibration("") == pytest.approx(3.0)


def test_each_tenant_is_judged_by_its_own_errors_once_it_has_enough() -> None:
    clock = Clock()
    waits = WaitEstimate(window_s=30.0, clock=clock)
    served(waits, clock, "", 20, 0.5)
    for tenant, late_by in (("gold", 1.0), ("bronze", 4.0)):
        for i in range(MIN_CALIBRATION_SAMPLES):
            waits.admit(tenant, 1.0, "normal", Prediction(1.0, 2, 2.0))
            waits.submitted(f"{tenant}-{i}", tenant, 1.0, "normal")
        clock.now += late_by
        for i in range(MIN_CALIBRATION_SAMPLES):
            waits.first_token(f"{tenant}-{i}")
    assert waits.calibration("gold") == pytest.approx(1.0)
    assert waits.calibration("bronze") == pytest.approx(4.0)  # 4 s on a 1 s prediction


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
        # one request that gets no token: the next is predicted to wait 1 / the first-token rate,
        # and one first token in the seconds since the gateway started is far below 2 a second
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
