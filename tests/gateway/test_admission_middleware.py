"""The admission middleware counts the generation requests it has let into the app: a burst that
arrives as room frees up is refused at the door, not after a trip through the app. `Admission`,
which owns the counters, the rule and the 429, as a plain object: its slots, its tokenizing count
and the one refusal every path gives."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.types import Message, Receive, Scope, Send

from mohawk_gateway.admission import Admission, BurstHold
from mohawk_gateway.config import GatewaySettings
from mohawk_gateway.errors import GatewayError
from mohawk_gateway.middleware import AdmissionMiddleware

HOLD = GatewaySettings.model_construct().burst_hold  # the defaults
FIRST_LOOK_S, QUIET_S, MAX_HOLD_S = HOLD.first_look_s, HOLD.quiet_s, HOLD.max_hold_s

PATH = "/v1/chat/completions"


def scope(path: str = PATH, body: bytes = b"{}") -> Scope:
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(b"content-length", str(len(body)).encode())],
    }


class Held:
    """An app whose requests stay inside until released (the gateway's own count never moves)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.entered += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(app: AdmissionMiddleware, request: Scope) -> list[Message]:
    sent: list[Message] = []
    body = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> Message:
        return body.pop(0) if body else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(request, receive, send)
    return sent


def test_past_max_active_requests_are_refused_at_the_door_and_room_returns_when_they_end() -> None:
    async def run() -> None:
        inner = Held()
        admission = Admission(max_in_flight=3, retry_after_s=2, hold=HOLD)
        app = AdmissionMiddleware(inner, admission=admission, paths=frozenset({PATH}))
        admitted = [asyncio.create_task(call(app, scope())) for _ in range(3)]
        await asyncio.sleep(0)
        refused = await asyncio.gather(*(call(app, scope()) for _ in range(5)))
        assert admission.num_active == 3
        await asyncio.sleep(FIRST_LOOK_S + QUIET_S + 0.05)  # the refusals paused: in they go
        assert inner.entered == 3
        for sent in refused:
            start = sent[0]
            assert start["status"] == 429
            headers = dict(start["headers"])
            assert headers[b"retry-after"] == b"2" and b"connection" not in headers  # body drained
            assert headers[b"x-mohawk-refusal"] == b"gateway_full"
            assert json.loads(sent[1]["body"])["error"]["code"] == "rate_limit_exceeded"
        other = asyncio.create_task(call(app, scope(path="/v1/sessions")))  # not a generation path
        await asyncio.sleep(0.01)
        assert inner.entered == 4 and admission.num_active == 3  # let in, and not counted
        inner.release.set()
        assert [sent[0]["status"] for sent in await asyncio.gather(*admitted, other)] == [200] * 4
        assert admission.num_active == 0
        assert (await call(app, scope()))[0]["status"] == 200

    asyncio.run(run())


def test_the_gateways_own_count_refuses_too() -> None:
    async def run() -> None:
        inner = Held()
        inner.release.set()
        admission = Admission(max_in_flight=8, retry_after_s=1, hold=HOLD)
        app = AdmissionMiddleware(inner, admission=admission, paths=frozenset({PATH}))
        slots = [admission.take_slot() for _ in range(6)]  # requests in flight
        with admission.tokenizing(), admission.tokenizing():  # and two prompts being tokenized
            assert (await call(app, scope()))[0]["status"] == 429 and inner.entered == 0
        slots.pop().release()
        assert (await call(app, scope()))[0]["status"] == 200 and inner.entered == 1

    asyncio.run(run())


def test_a_bursts_refusals_go_out_before_the_requests_it_let_in_enter_the_app() -> None:
    """A refusal costs one pre-encoded answer, an admitted request a trip through the app: while a
    burst is being refused, the few it let in wait at the door (bounded by MAX_HOLD_S)."""

    async def run() -> None:
        inner = Held()
        app = AdmissionMiddleware(
            inner, admission=Admission(max_in_flight=2, retry_after_s=2, hold=HOLD), paths=frozenset({PATH})
        )
        admitted = [asyncio.create_task(call(app, scope())) for _ in range(2)]
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < 0.1:  # refusals every 5 ms for 100 ms
            assert (await call(app, scope()))[0]["status"] == 429
            assert inner.entered == 0
            await asyncio.sleep(0.005)
        await asyncio.sleep(QUIET_S + 0.05)
        assert inner.entered == 2
        inner.release.set()
        await asyncio.gather(*admitted)
        # refusals that never pause hold an admitted request MAX_HOLD_S at most
        inner.release.clear()
        held = asyncio.create_task(call(app, scope()))
        second = asyncio.create_task(call(app, scope()))
        await asyncio.sleep(0)
        started = loop.time()
        while inner.entered < 4:
            assert (await call(app, scope()))[0]["status"] == 429
            await asyncio.sleep(0.002)
        assert loop.time() - started < MAX_HOLD_S + 0.2
        inner.release.set()
        await asyncio.gather(held, second)

    asyncio.run(run())


def test_admission_holds_the_room_rule_and_the_one_429() -> None:
    admission = Admission(max_in_flight=2, retry_after_s=3, hold=HOLD)
    first = admission.take_slot()
    with admission.tokenizing():
        assert not admission.has_room()
        with pytest.raises(GatewayError) as refused:
            admission.check_room()
        assert refused.value.body() == admission.error.body()  # the one 429 every path gives
        assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "3"
        second = admission.take_slot()  # submission counts in-flight requests only
    with pytest.raises(GatewayError):
        admission.take_slot()
    first.release()
    first.release()  # a slot gives its room back once
    assert admission.num_in_flight == 1 and admission.has_room()
    second.release()
    assert (admission.num_in_flight, admission.num_tokenizing, admission.num_active) == (0, 0, 0)
    assert json.loads(admission.error_body)["error"]["code"] == "rate_limit_exceeded"


def test_with_no_hold_an_admitted_request_goes_in_at_once_even_during_refusals() -> None:
    """admission_max_hold_s 0: the middleware never holds an admitted request back."""

    async def run() -> None:
        inner = Held()
        admission = Admission(max_in_flight=1, retry_after_s=1, hold=BurstHold(0.0, 0.0, 0.0))
        app = AdmissionMiddleware(inner, admission=admission, paths=frozenset({PATH}))
        first = asyncio.create_task(call(app, scope()))
        await asyncio.sleep(0)
        refused = await call(app, scope())  # a refusal just now: a burst under way
        assert refused[0]["status"] == 429
        inner.release.set()
        await first
        started = asyncio.get_running_loop().time()
        assert (await call(app, scope()))[0]["status"] == 200
        assert asyncio.get_running_loop().time() - started < HOLD.quiet_s  # not held for the burst

    asyncio.run(run())
