"""Stage 0 binds its request consumers even while a clustered JetStream is electing new leaders
(right after a host is lost it does not answer for a few seconds): a bind that times out is tried
again, for `BIND_WAIT_S`, instead of failing the plan (which left a re-planned stage 0 that never
pulled a request)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
import structlog
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NoStreamResponseError

from mohawk_shard.node import intake
from mohawk_shard.node.intake import RequestIntake


class ElectingJetStream:
    """Stands in for the JetStream context's `pull_subscribe` only: unanswered `failures` times."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls: list[str] = []

    async def pull_subscribe(self, subject: str, **kwargs: Any) -> str:
        self.calls.append(kwargs["durable"])
        if self.failures:
            raise self.failures.pop(0)
        return f"bound {kwargs['durable']}"


def make_intake(js: ElectingJetStream) -> RequestIntake:
    none = cast(Any, None)
    return RequestIntake(
        nc=none,
        js=cast(Any, js),
        security=none,
        served_model="m",
        table=cast(Any, type("Table", (), {"core": None, "traces": None})()),
        bus=none,
        routes=none,
        max_waiting=1,
        ack_wait_s=10.0,
        wake=lambda: None,
        log=structlog.get_logger("test"),
    )


def test_a_bind_that_jetstream_does_not_answer_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake, "_BIND_RETRY_S", 0.01)
    js = ElectingJetStream([NatsTimeoutError(), NoStreamResponseError()])
    bound = asyncio.run(make_intake(js)._consumer(None))
    assert bound == f"bound {js.calls[0]}" and len(js.calls) == 3


def test_a_bind_still_unanswered_after_the_wait_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake, "_BIND_RETRY_S", 0.01)
    monkeypatch.setattr(intake, "BIND_WAIT_S", 0.05)
    js = ElectingJetStream([NatsTimeoutError() for _ in range(100)])
    with pytest.raises(NatsTimeoutError):
        asyncio.run(make_intake(js)._consumer(None))
    assert 2 <= len(js.calls) < 100
