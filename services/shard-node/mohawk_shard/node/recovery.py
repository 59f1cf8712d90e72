"""Replaying what a request already emitted, so a new stage 0 continues it at the next index."""

from __future__ import annotations

from google.protobuf.message import DecodeError
from nats.js import JetStreamContext

from mohawk_common.bus import names
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.seal import EventBox
from mohawk_proto.v1 import engine_pb2

_READ_TIMEOUT_S = 2.0


async def read_emitted(js: JetStreamContext, request_id: str, box: EventBox | None) -> tuple[list[int], bool]:
    """Token ids emitted so far (contiguous from index 0), and whether the request already ended.

    Events that do not open with the request's key (or, without one, do not parse) are skipped."""
    subject = names.token_subject(request_id)
    info = await js.stream_info(names.TOKENS_STREAM, subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    if count == 0:
        return [], False
    events: dict[int, engine_pb2.TokenEvent] = {}
    sub = await js.subscribe(subject, stream=names.TOKENS_STREAM, ordered_consumer=True)
    try:
        for _ in range(count):
            msg = await sub.next_msg(timeout=_READ_TIMEOUT_S)
            try:
                event = engine_pb2.TokenEvent.FromString(msg.data if box is None else box.open(msg.data))
            except (AuthenticationError, DecodeError):
                continue
            events.setdefault(event.index, event)
    finally:
        await sub.unsubscribe()
    tokens: list[int] = []
    while (event := events.get(len(tokens))) is not None:
        if event.error:
            return tokens, True
        tokens.append(event.token_id)
        if event.finish_reason:
            return tokens, True
    return tokens, False
