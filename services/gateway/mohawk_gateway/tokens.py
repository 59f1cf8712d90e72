"""`TokenStream`: one request's token events, each index exactly once and in order.

Events arrive on core NATS (`mohawk.v1.tok.<request>`), to which the gateway subscribed before it
published the request, so none is missed while the connection holds. `index` counts tokens from 0
with no gaps: an index already delivered is a duplicate (a recovered pipeline re-emits what it
cannot know was seen) and is dropped; an index ahead of the next one waits in a small reorder
buffer. Core NATS drops what arrives while the gateway is reconnecting, so the same events are
also read back from the TOKENS stream (JetStream keeps them for minutes) when a gap stays open for
`gap_wait_s`, or when nothing arrives for `idle_probe_s` (the lost event may be the last one).
An event with `error` set, or a finish for an index already delivered, ends the stream at once.
Events of a sealed request are encrypted with its token key (`EventBox`); one that does not open
is rejected (counted) and dropped, never shown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from google.protobuf.message import DecodeError
from nats.aio.msg import Msg

from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.seal import EventBox
from mohawk_proto.v1 import engine_pb2

log = structlog.get_logger("mohawk.gateway")

Replay = Callable[[str], Awaitable[list[engine_pb2.TokenEvent]]]


class TokenStream:
    """Ordered, deduplicated token events of `request_id`; feed it with `on_message`."""

    def __init__(
        self,
        request_id: str,
        replay: Replay,
        *,
        gap_wait_s: float,
        idle_probe_s: float,
        on_duplicate: Callable[[], None] | None = None,
        on_replay: Callable[[], None] | None = None,
        box: EventBox | None = None,
        on_reject: Callable[[AuthenticationError], None] | None = None,
    ) -> None:
        self.request_id = request_id
        self.next_index = 0
        self._replay = replay
        self._gap_wait_s = gap_wait_s
        self._idle_probe_s = idle_probe_s
        self._on_duplicate = on_duplicate
        self._on_replay = on_replay
        self._box = box
        self._on_reject = on_reject
        self._inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._pending: dict[int, engine_pb2.TokenEvent] = {}
        self._terminal: engine_pb2.TokenEvent | None = None

    async def on_message(self, msg: Msg) -> None:
        """The subscription's callback."""
        self._inbox.put_nowait(msg.data)

    async def next(self, deadline: float) -> engine_pb2.TokenEvent:
        """The next event; `TimeoutError` once the event loop's clock passes `deadline`."""
        loop = asyncio.get_running_loop()
        while True:
            ready = self._take_ready()
            if ready is not None:
                return ready
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError
            wait = min(self._gap_wait_s if self._pending else self._idle_probe_s, remaining)
            try:
                async with asyncio.timeout(wait):
                    data = await self._inbox.get()
            except TimeoutError:
                await self._read_back()
                continue
            event = self._parse(data)
            if event is not None:
                self._accept(event, live=True)

    def _take_ready(self) -> engine_pb2.TokenEvent | None:
        if self._terminal is not None:
            return self._terminal
        event = self._pending.pop(self.next_index, None)
        if event is not None:
            self.next_index += 1
        return event

    def _accept(self, event: engine_pb2.TokenEvent, *, live: bool) -> None:
        if event.request_id and event.request_id != self.request_id:
            return
        if event.error:
            self._terminal = event
        elif event.index < self.next_index or event.index in self._pending:
            if event.finish_reason and event.index < self.next_index:
                self._terminal = _finish_only(event)
            elif live and self._on_duplicate is not None:
                self._on_duplicate()
        else:
            self._pending[event.index] = event

    async def _read_back(self) -> None:
        if self._on_replay is not None:
            self._on_replay()
        try:
            events = await self._replay(self.request_id)
        except Exception as exc:  # the bus may be down right now; the live subscription still counts
            log.warning("token replay failed", request_id=self.request_id, error=str(exc) or repr(exc))
            return
        for event in events:
            self._accept(event, live=False)

    def _parse(self, data: bytes) -> engine_pb2.TokenEvent | None:
        try:
            return engine_pb2.TokenEvent.FromString(data if self._box is None else self._box.open(data))
        except AuthenticationError as exc:
            if self._on_reject is not None:
                self._on_reject(exc)
            return None
        except DecodeError:
            log.warning("undecodable token event dropped", request_id=self.request_id, size=len(data))
            return None


def _finish_only(event: engine_pb2.TokenEvent) -> engine_pb2.TokenEvent:
    """The finish (and usage) of a duplicate last event, without the token already delivered."""
    finish = engine_pb2.TokenEvent(
        request_id=event.request_id, index=event.index, finish_reason=event.finish_reason
    )
    if event.HasField("usage"):
        finish.usage.CopyFrom(event.usage)
    return finish
