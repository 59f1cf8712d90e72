"""ASGI middleware: early refusal when there is no room (429), a hard cap on request bodies (413), and
request counts by endpoint and status.

The admission check runs before the body is read, parsed or routed: a burst of clients past
`max_in_flight` costs the gateway one pre-encoded answer each, so their 429s come back at once
instead of queueing behind request parsing (`bench/admission.py` measures it).

The body cap reads the body itself, never more than `max_bytes` (plus one chunk): a declared
Content-Length over the cap is refused before reading anything, and a chunked body is refused
as soon as it grows past the cap. The buffered body is then replayed to the app; later `receive`
calls go to the server, so the app still hears a client disconnect.
"""

from __future__ import annotations

import asyncio
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mohawk_gateway.admission import Admission
from mohawk_gateway.errors import GatewayError
from mohawk_gateway.metrics import GatewayMetrics

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class AdmissionMiddleware:
    """429 with Retry-After for a generation request when there is no room, before anything else
    is done with it: the door of `Admission` (`admission.py`, which owns the counters, the rule and
    the answer). A body of a declared length up to `drain_bytes` is read and dropped, so the
    client's keep-alive connection serves its retry (as the OpenAI SDK's pooled connections
    expect); a longer or chunked one is left unread and the connection closed."""

    def __init__(
        self, app: ASGIApp, admission: Admission, paths: frozenset[str], drain_bytes: int = 1 << 20
    ) -> None:
        self.app, self.admission, self.paths, self.drain_bytes = app, admission, paths, drain_bytes
        self._refused_at = float("-inf")  # loop time of the last refusal
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(admission.error_body)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in admission.error.headers.items()),
        ]
        self._keep_headers = headers
        self._close_headers = [*headers, (b"connection", b"close")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        if not self.admission.door_open():
            self._refused_at = asyncio.get_running_loop().time()
            await self._refuse(scope, receive, send)
            return
        with self.admission.inside():
            await self._refusals_first()
            await self.app(scope, receive, send)

    async def _refusals_first(self) -> None:
        """While refusals are being sent (a burst past the room), hold an admitted request back until
        they pause for `quiet_s`, at most `max_hold_s` (`Admission.hold`, settings): a refusal costs
        the loop one pre-encoded answer, an admitted request a trip through the app (JSON, chat
        template, tokenizer, sealing), and a burst's 429s should not wait behind the work of the
        few requests it let in."""
        hold = self.admission.hold
        if hold.max_hold_s <= 0:
            return
        loop = asyncio.get_running_loop()
        held_until = loop.time() + hold.max_hold_s
        if hold.first_look_s > 0:  # the first requests of a burst arrive before its refusals
            await asyncio.sleep(hold.first_look_s)
        while loop.time() - self._refused_at < hold.quiet_s and loop.time() < held_until:
            await asyncio.sleep(hold.quiet_s)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = _content_length(scope)
        headers = self._close_headers
        if length is not None and length <= self.drain_bytes:
            if not await _drain(receive):
                return  # the client left
            headers = self._keep_headers
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": self.admission.error_body})


async def _drain(receive: Receive) -> bool:
    """Read a request's body to its end; False when the client disconnected instead."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        if not message.get("more_body", False):
            return True


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, send: Send) -> None:
        error = GatewayError(
            413, f"request body is larger than {self.max_bytes} bytes", code="body_too_large"
        )
        body = json.dumps(error.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class MetricsMiddleware:
    """Counts every HTTP answer by route template (`other` for unknown paths) and status."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, endpoints: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = self._endpoint(scope.get("path", ""))
        status = 499  # the client left before any answer

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        except Exception:
            status = 500
            raise
        finally:
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def _endpoint(self, path: str) -> str:
        if path in self.endpoints:
            return path
        if path.startswith("/v1/models/"):
            return "/v1/models/{model}"
        return "other"
