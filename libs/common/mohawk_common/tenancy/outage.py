"""Noticing that Redis is down, saying so once, and not asking it again for a moment.

Each call that reaches Redis while it is down costs a connect timeout, so after a failure the
callers answer from what they hold for `retry_s` before trying Redis again; one warning marks the
start of an outage and one line its end, however many calls fail in between.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

log = structlog.get_logger("mohawk.tenancy")


class Outage:
    def __init__(self, what: str, retry_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what  # what goes on without Redis, for the log lines
        self.retry_s = retry_s
        self.clock = clock
        self.down = False
        self._retry_at = 0.0

    def should_try(self) -> bool:
        """Whether to ask Redis now: always while it is up, once every `retry_s` while it is down."""
        return not self.down or self.clock() >= self._retry_at

    def failed(self, error: Exception) -> None:
        if not self.down:
            log.warning("redis unreachable", fallback=self.what, error=str(error) or type(error).__name__)
        self.down = True
        self._retry_at = self.clock() + self.retry_s

    def succeeded(self) -> None:
        if self.down:
            log.info("redis reachable again", resumed=self.what)
        self.down = False
