"""Server-sent events: `data: <json>` lines ending in `data: [DONE]`, and a response that always
notices a client that went away (so its request is cancelled on the bus at once, not at the next
token) and always runs its cleanup, whichever way the stream ends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress

import anyio
import structlog
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from mohawk_gateway.errors import GatewayError

log = structlog.get_logger("mohawk.gateway")

DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def sse_lines(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """Each JSON chunk as an SSE event; an error mid-stream becomes an OpenAI error event; then DONE."""
    try:
        async for chunk in chunks:
            yield f"data: {chunk}\n\n"
    except GatewayError as exc:
        yield f"data: {json.dumps(exc.body())}\n\n"
    except Exception:  # never a traceback to the client; the log has it
        log.exception("stream failed")
        yield f"data: {json.dumps(GatewayError(500, 'internal error while streaming').body())}\n\n"
    yield DONE


class EventStreamResponse(StreamingResponse):
    """A `text/event-stream` response that calls `on_close` once, after the stream ends or the client
    disconnects; cleanup is shielded from the cancellation that ends the stream."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(content, headers=SSE_HEADERS, media_type=self.media_type)
        self._content = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    with suppress(OSError):  # the client went away while we were writing
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self._content, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self._on_close()
