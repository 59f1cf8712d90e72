"""Turning an admitted request into an HTTP answer: one JSON body, or an SSE stream.

Both forms wait for the first token event before answering, so an error the engine reports at
once (a prompt it refuses) still gets its own HTTP status; a client that disconnects while the
gateway waits is noticed at once, and its request cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.types import Receive

from mohawk_common.tasks import cancel_and_wait
from mohawk_gateway.api.errors import ClientDisconnected
from mohawk_gateway.generation import Generation
from mohawk_gateway.shared_state import Gateway
from mohawk_gateway.sse import EventStreamResponse, sse_lines
from mohawk_gateway.submission import Submission
from mohawk_proto.v1 import engine_pb2

T = TypeVar("T")


class Renderer(Protocol):
    def completion(self, events: Sequence[engine_pb2.TokenEvent], num_tokens: int) -> BaseModel: ...

    def chunks(self, first: engine_pb2.TokenEvent, generation: Generation) -> AsyncIterator[str]: ...


async def respond(
    request: Request, gateway: Gateway, submission: Submission, renderer: Renderer, *, stream: bool
) -> Response:
    """Start the generation `submission` asks for and answer with it."""
    generation = await Generation.start(gateway, submission)
    return await answer(request, generation, renderer, stream=stream, close=generation.close)


async def answer(
    request: Request,
    generation: Generation,
    renderer: Renderer,
    *,
    stream: bool,
    close: Callable[[], Awaitable[None]],
) -> Response:
    """The started `generation` as one JSON body or an SSE stream; `close` (which must close the
    generation) runs once, however the answer ends."""
    if not stream:
        try:
            events = await until_disconnected(request, generation.collect())
        finally:
            await close()
        body = renderer.completion(events, generation.num_tokens)
        return JSONResponse(body.model_dump(mode="json"), headers=generation.rate_headers)
    try:
        first = await until_disconnected(request, generation.next_event())
    except BaseException:
        await close()
        raise
    chunks = _closing_when_done(renderer.chunks(first, generation), close)
    response = EventStreamResponse(sse_lines(chunks), on_close=close)
    response.headers.update(generation.rate_headers)
    return response


async def _closing_when_done(
    chunks: AsyncIterator[str], close: Callable[[], Awaitable[None]]
) -> AsyncIterator[str]:
    """`chunks`, then `close()` before the stream's `[DONE]`: a client that has read the whole answer
    finds its request accounted for (concurrency quota, in-flight count, a session's turn lock)
    and may send its next one at once. A stream that ends otherwise is closed by `on_close`."""
    async for chunk in chunks:
        yield chunk
    await close()


async def until_disconnected(request: Request, awaitable: Awaitable[T]) -> T:
    """`awaitable`'s result, or `ClientDisconnected` (with `awaitable` cancelled) if the client leaves."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.create_task(_wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(*(task for task in (watch, work) if not task.done()))
    if work.cancelled():
        raise ClientDisconnected
    return work.result()


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
