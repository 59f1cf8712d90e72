"""How far a stage's weights have loaded, logged while they load.

A multi-GB file takes a node seconds to tens of seconds to repack; whoever waits on it (`mohawk
up`, an operator tailing the log) should see it move. `LoadProgress` is told each time a layer's
matmuls are held and logs `LOADING_EVENT` with the layers loaded so far, at most once per
`interval_s` and always for the last layer, so a fast load logs one line and a slow one a line a
second. `mohawk up` reads the latest of these from each node's log while it waits. A stage
built inside `quiet()` (the one-layer stage a node measures itself with) says nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import structlog

LOADING_EVENT = "loading weights"
MEASURED_EVENT = "node measured"  # a node has measured itself; its stage's load follows
# a stage's KV pool mapped untouched, and later faulted in whole (`kernels/pool_residency.py`)
POOL_MAPPED_EVENT, POOL_RESIDENT_EVENT = "kv pool mapped", "kv pool resident"

log = structlog.get_logger("mohawk.shard.weights")
_QUIET: ContextVar[bool] = ContextVar("mohawk_quiet_load", default=False)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Stages built inside this block (on this thread) log no progress."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


class LoadProgress:
    def __init__(
        self,
        start: int,
        end: int,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        emit: Callable[..., Any] | None = None,
    ) -> None:
        self.layers, self.total = f"[{start}, {end})", end - start
        self.loaded = 0
        self._interval_s, self._clock = interval_s, clock
        self._emit = emit or (lambda **fields: log.info(LOADING_EVENT, **fields))
        self._started = self._last = clock()

    def layer_loaded(self) -> None:
        """One more layer of the stage is held; log where the load stands if it is time to."""
        self.loaded += 1
        if _QUIET.get():
            return
        now = self._clock()
        if self.loaded < self.total and now - self._last < self._interval_s:
            return
        self._last = now
        self._emit(
            layers=self.layers,
            loaded=self.loaded,
            of=self.total,
            percent=round(100 * self.loaded / max(1, self.total)),
            seconds=round(now - self._started, 1),
        )
