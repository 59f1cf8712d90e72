"""Stopping background tasks for certain.

Design. A single `task.cancel()` can be lost on Python 3.11: `asyncio.wait_for`, which nats-py
uses inside every request, fetch and flush, returns the awaited result when a cancellation lands
in the same loop iteration as that result, and the cancellation is gone. A service loop that
was cancelled that way runs on, and `await task` after `cancel()` waits for it forever; that is
how a coordinator once ignored SIGTERM in CI. `cancel_and_wait` therefore cancels again, every
`RECANCEL_S`, until each task has ended. A task that ends with an error other than the
cancellation has that error raised here, as `await task` would have done.
"""

from __future__ import annotations

import asyncio
from typing import Any

RECANCEL_S = 0.05


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel each task and return once all have ended; the first one's own error is raised."""
    pending = {task for task in tasks if task is not None}
    ended: list[asyncio.Future[Any]] = []
    while pending:
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
        ended.extend(done)
    errors = [task.exception() for task in ended if not task.cancelled()]
    for error in errors:
        if error is not None:
            raise error
