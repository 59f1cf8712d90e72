"""Stage 0 admits a pull's requests side by side: the requests a failover handed back each read
what they emitted from the token stream first, and those reads overlap instead of queueing one
behind another (16 of them held the new stage 0's first step back by ~50 ms); a request delivered
twice in one pull is admitted once. The token stream is stood in for by a reader that takes a
while; the requests are real `GenerateRequest`s."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest
import structlog

from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node import intake
from mohawk_shard.node.intake import RequestIntake

READ_S = 0.05


class Table:
    """The request table's admission, and the engine core's lookups it reads."""

    def __init__(self) -> None:
        self.admitted: list[tuple[str, list[int]]] = []
        self.core = SimpleNamespace(
            request=lambda request_id: request_id if request_id in dict(self.admitted) else None,
            check_prompt=lambda request_id, prompt: list(prompt),
        )
        self.traces = SimpleNamespace(enabled=False)

    def admit(self, delivery: object, request_id: str, prompt: list[int], *rest: object) -> None:
        self.admitted.append((request_id, prompt))


def handed_back(request_id: str) -> SimpleNamespace:
    """A request's stream message as delivered the second time (a failover handed it back)."""
    request = bus_pb2.GenerateRequest(request_id=request_id, prompt_token_ids=[1, 2, 3])
    request.sampling.max_tokens, request.sampling.top_p = 8, 1.0
    metadata = SimpleNamespace(num_delivered=2, timestamp=datetime.now(UTC))
    return SimpleNamespace(data=request.SerializeToString(), headers=None, subject="req", metadata=metadata)


def test_handed_back_requests_read_what_they_emitted_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    reading = 0
    most = 0

    async def read_emitted(js: object, request_id: str, box: object) -> tuple[list[int], bool]:
        nonlocal reading, most
        reading += 1
        most = max(most, reading)
        await asyncio.sleep(READ_S)
        reading -= 1
        return [7, 8], False

    monkeypatch.setattr(intake, "read_emitted", read_emitted)
    monkeypatch.setattr(intake, "open_request", lambda data, *_: bus_pb2.GenerateRequest.FromString(data))
    monkeypatch.setattr(intake, "check_fresh", lambda *_, **__: None)
    table = Table()
    none = cast(Any, None)
    woken: list[int] = []
    taking = RequestIntake(
        nc=none,
        js=none,
        security=none,
        served_model="m",
        table=cast(Any, table),
        bus=none,
        routes=none,
        max_waiting=32,
        ack_wait_s=10.0,
        wake=lambda: woken.append(len(table.admitted)),
        log=structlog.get_logger("test"),
    )
    msgs = [handed_back(f"r{i}") for i in range(16)] + [handed_back("r3")]  # r3 delivered twice
    started = time.monotonic()
    asyncio.run(taking._admit_all(cast(Any, msgs)))
    took = time.monotonic() - started
    assert sorted(request_id for request_id, _ in table.admitted) == sorted(f"r{i}" for i in range(16))
    assert most == 16, f"at most {most} reads at a time"
    assert took < 16 * READ_S / 2, f"{took:.2f} s: the reads queued"
    assert woken == [16]  # the step loop is woken once, with every request in
