"""Turning an admitted request into an HTTP answer: one JSON body, or an SSE stream.

Both forms wait for the first token event before answering, so an error the engine reports at
once (a prompt it refuses) still gets its own HTTP status; a client that disconnects while the
gateway waits is noticed at once, and its request cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.types import Receive

from mohawk_common.tasks import cancel_and_wait
from mohawk_gateway.api.errors import ClientDisconnected
from mohawk_gateway.errors import invalid
from mohawk_gateway.handlers import Gateway, Generation, Submission
from mohawk_gateway.sse import EventStreamResponse, sse_lines
from mohawk_proto.v1 import engine_pb2

T = TypeVar("T")


class Renderer(Protocol):
    def completion(self, events: Sequence[engine_pb2.TokenEvent], num_tokens: int) -> BaseModel: ...

    def chunks(self, first: engine_pb2.TokenEvent, generation: Generation) -> AsyncIterator[str]: ...


async def respond(
    request: Request, gateway: Gateway, submission: Submission, renderer: Renderer, *, stream: bool
) -> Response:
    generation = await gateway.start(submission)
    if not stream:
        try:
            events = await until_disconnected(request, generation.collect())
        finally:
            await generation.close()
        body = renderer.completion(events, generation.num_tokens)
        return JSONResponse(body.model_dump(mode="json"))
    try:
        first = await until_disconnected(request, generation.next_event())
    except BaseException:
        await generation.close()
        raise
    return EventStreamResponse(sse_lines(renderer.chunks(first, generation)), on_close=generation.close)


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


async def encode_in_thread(
    gateway: Gateway, encode: Callable[[T], list[int]], prompt: T, param: str
) -> list[int]:
    """Tokenize off the event loop, in a few threads, once there is room for the request (else 429 at
    once); 400 if it comes out empty."""
    gateway.check_room()
    gateway.num_tokenizing += 1
    try:
        token_ids = await anyio.to_thread.run_sync(encode, prompt, limiter=gateway.tokenize_limiter)
    finally:
        gateway.num_tokenizing -= 1
    gateway.metrics.prompts_tokenized.inc()
    if not token_ids:
        raise invalid("the prompt is empty after tokenization", param)
    return token_ids
