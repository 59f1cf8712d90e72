"""Replaying what a request already emitted, so a new stage 0 continues it at the next index."""

from __future__ import annotations

from nats.js import JetStreamContext

from mohawk_common.bus.token_log import TokenLogReader
from mohawk_pqc.seal import EventBox
from mohawk_proto.v1 import engine_pb2


async def read_emitted(js: JetStreamContext, request_id: str, box: EventBox | None) -> tuple[list[int], bool]:
    """Token ids emitted so far (contiguous from index 0), and whether the request already ended."""
    events: dict[int, engine_pb2.TokenEvent] = {}
    for stored in await TokenLogReader(js, request_id, box).read_new():
        events.setdefault(stored.index, stored)
    tokens: list[int] = []
    while (event := events.get(len(tokens))) is not None:
        if event.error:
            return tokens, True
        tokens.append(event.token_id)
        if event.finish_reason:
            return tokens, True
    return tokens, False
