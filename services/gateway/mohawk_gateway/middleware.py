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

import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mohawk_gateway.errors import GatewayError, overloaded
from mohawk_gateway.metrics import GatewayMetrics

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class AdmissionMiddleware:
    """429 with Retry-After for a generation request when `has_room()` says no, before anything
    else is done with it (the route checks again, exactly, once the request is admitted)."""

    def __init__(
        self, app: ASGIApp, has_room: Callable[[], bool], paths: frozenset[str], retry_after_s: int
    ) -> None:
        self.app, self.has_room, self.paths = app, has_room, paths
        error = overloaded("too many requests in flight; retry later", retry_after_s)
        self._body = json.dumps(error.body()).encode()
        self._headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self._body)).encode()),
            (b"connection", b"close"),  # the unread body is not drained
            *((k.lower().encode(), v.encode()) for k, v in error.headers.items()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope.get("path") in self.paths
            and not self.has_room()
        ):
            await send({"type": "http.response.start", "status": 429, "headers": self._headers})
            await send({"type": "http.response.body", "body": self._body})
            return
        await self.app(scope, receive, send)


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
