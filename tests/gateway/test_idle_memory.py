"""An idle gateway collects the cyclic garbage its requests left (with the automatic collector
off, as it effectively is in an idle process: nothing allocates) and trims the heap, once per idle
period, and not while requests start or end, nor while one is in flight."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from mohawk_common.memory_trim import IdleTrim
from mohawk_gateway import idle_memory


class Request:
    """Refers to itself through a callback, as a generation and its token stream do."""

    def __init__(self) -> None:
        self.on_message = lambda: self


def test_an_idle_gateway_collects_its_requests_cycles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idle_memory, "CHECK_EVERY_S", 0.02)

    async def run() -> None:
        activity = [0]
        idle = IdleTrim(idle_s=0.2)
        task = asyncio.create_task(
            idle_memory.give_back_memory_when_idle(lambda: activity[0], lambda: False, idle)
        )
        try:
            garbage = weakref.ref(Request())  # unreachable at once, but in a cycle
            for _ in range(10):  # busy: requests keep starting and ending
                activity[0] += 1
                await asyncio.sleep(0.05)
                assert garbage() is not None and idle.num_trims == 0
            await asyncio.sleep(0.5)  # idle
            assert garbage() is None and idle.num_trims == 1
            await asyncio.sleep(0.3)
            assert idle.num_trims == 1  # once per idle period
        finally:
            task.cancel()

    gc.disable()
    try:
        asyncio.run(run())
    finally:
        gc.enable()


def test_a_request_in_flight_keeps_the_gateway_from_trimming(monkeypatch: pytest.MonkeyPatch) -> None:
    """One long answer (seconds on a big model) starts nothing and ends nothing while it streams:
    it must not count as idle, or the collection and trim take a core from the nodes mid-answer."""
    monkeypatch.setattr(idle_memory, "CHECK_EVERY_S", 0.02)

    async def run() -> None:
        in_flight = [True]
        idle = IdleTrim(idle_s=0.1)
        task = asyncio.create_task(
            idle_memory.give_back_memory_when_idle(lambda: 1, lambda: in_flight[0], idle)
        )
        try:
            await asyncio.sleep(0.4)  # four idle periods with the counter standing still
            assert idle.num_trims == 0
            in_flight[0] = False  # it ended
            await asyncio.sleep(0.4)
            assert idle.num_trims == 1
        finally:
            task.cancel()

    asyncio.run(run())
