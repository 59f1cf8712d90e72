"""Reading one request's token events back from the TOKENS stream, in batches, from a cursor.

The last stage publishes token events on core NATS; the TOKENS stream keeps them, and is the
record that a gateway which missed some (it was reconnecting) and a stage 0 that resumes a
request (`node/recovery.py`) read back. One ordered push consumer per read delivers every event
after the cursor in a single flow, instead of one request/reply round trip per message, and the
reader remembers the stream sequence it reached, so a gateway that probes a silent request every
few seconds reads only what is new. Events that do not open with the request's key (or, without
one, do not parse) are skipped.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from mohawk_common.bus import names
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.seal import EventBox
from mohawk_proto.v1 import engine_pb2

READ_TIMEOUT_S = 2.0


class TokenLogReader:
    def __init__(self, js: JetStreamContext, request_id: str, box: EventBox | None = None) -> None:
        self.js, self.request_id, self.box = js, request_id, box
        self.subject = names.token_subject(request_id)
        self.cursor = 0  # the last stream sequence read

    async def read_new(self) -> list[engine_pb2.TokenEvent]:
        """The request's events stored after the last read, oldest first."""
        try:
            last = await self.js.get_last_msg(names.TOKENS_STREAM, self.subject)
        except NotFoundError:
            return []
        end = last.seq or 0
        if end <= self.cursor:
            return []
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.cursor + 1)
        sub = await self.js.subscribe(
            self.subject, stream=names.TOKENS_STREAM, ordered_consumer=True, config=config
        )
        events: list[engine_pb2.TokenEvent] = []
        try:
            while self.cursor < end:
                msg = await sub.next_msg(timeout=READ_TIMEOUT_S)
                self.cursor = msg.metadata.sequence.stream
                event = self._open(msg.data)
                if event is not None:
                    events.append(event)
        finally:
            await sub.unsubscribe()
        return events

    def _open(self, data: bytes) -> engine_pb2.TokenEvent | None:
        try:
            return engine_pb2.TokenEvent.FromString(data if self.box is None else self.box.open(data))
        except (AuthenticationError, DecodeError):
            return None
