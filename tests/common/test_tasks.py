"""cancel_and_wait ends tasks whose cancellation Python 3.11's `asyncio.wait_for` swallowed."""

from __future__ import annotations

import asyncio
import sys

import pytest

from mohawk_common.tasks import cancel_and_wait


async def _replies_and_stop_together() -> asyncio.Task[None]:
    """A service loop awaiting replies as nats-py does, cancelled as a reply arrives."""
    loop = asyncio.get_running_loop()
    replies: list[asyncio.Future[int]] = []

    async def service_loop() -> None:
        while True:
            reply: asyncio.Future[int] = loop.create_future()
            replies.append(reply)
            await asyncio.wait_for(reply, 10)

    task = asyncio.create_task(service_loop())
    await asyncio.sleep(0)
    replies[-1].set_result(1)  # the reply lands...
    task.cancel()  # ...in the same loop iteration as the stop
    return task


def test_a_cancel_lost_in_wait_for_is_repeated_until_the_task_ends() -> None:
    async def scenario() -> None:
        task = await _replies_and_stop_together()
        if sys.version_info < (3, 12):
            await asyncio.sleep(0.2)
            assert not task.done(), "3.11's wait_for no longer swallows the cancel: the premise is gone"
        async with asyncio.timeout(5):
            await cancel_and_wait(task)
        assert task.cancelled()

    asyncio.run(scenario())


def test_an_error_raised_while_stopping_is_raised_to_the_caller() -> None:
    async def failing_on_stop() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    async def scenario() -> None:
        task = asyncio.create_task(failing_on_stop())
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="cleanup failed"):
            await cancel_and_wait(task, None)

    asyncio.run(scenario())


def test_finished_and_missing_tasks_are_fine() -> None:
    async def scenario() -> None:
        done = asyncio.create_task(asyncio.sleep(0))
        await done
        await cancel_and_wait(done, None)
        await cancel_and_wait()

    asyncio.run(scenario())
