"""A client of a test cluster's bus on its own thread: what an attacker (or an operator) sees and
writes, with whatever credential the test gives it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from nats.aio.client import Client

from mohawk_common.bus.connect import connect

T = TypeVar("T")


class BusClient:
    def __init__(self, url: str, **connect_args: Any) -> None:
        self.url = url
        self.connect_args = connect_args
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> BusClient:
        self._thread.start()
        self.nc: Client = self.run(connect([self.url], name="test-client", attempts=3, **self.connect_args))
        return self

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def __exit__(self, *exc: object) -> None:
        self.run(self.nc.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
