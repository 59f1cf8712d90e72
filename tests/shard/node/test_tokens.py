"""Token events carry the step's batch size and whether it overran the request's latency budget; a
step's results are made before its events are sent, and each event keeps its request's key."""

from __future__ import annotations

import asyncio
from typing import Any

from mohawk_common.bus import names
from mohawk_pqc.seal import EventBox
from mohawk_proto.v1 import engine_pb2
from mohawk_shard.engine.emitter import TokenEmitter
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.request_output import RequestOutput
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.node.tokens import EventRoute, TokenPublisher, token_event
from tests.shard.engine.test_detokenizer import tokenizer  # noqa: F401  (the bundled model's tokenizer)


def test_batch_size_and_budget_missed_travel_on_the_event() -> None:
    event = token_event(RequestOutput("r", 3, 42, "x", 5, 4, batch_size=6, budget_missed=True))
    decoded = engine_pb2.TokenEvent.FromString(event.SerializeToString())
    assert decoded.batch_size == 6 and decoded.budget_missed
    quiet = token_event(RequestOutput("r", 4, 43, "y", 5, 5, batch_size=2))
    assert quiet.batch_size == 2 and not quiet.budget_missed


class RecordingBus:
    """Stands in for the NATS client's publish only: what the publisher hands the bus, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.sent.append((subject, payload))


def test_a_step_is_emitted_first_and_its_events_published_after_with_their_keys(
    tokenizer: Any,  # noqa: F811  (the imported fixture)
) -> None:
    """The results (what stage 0 needs for the next step) are made without touching the bus; the
    events go out later, each sealed with its request's token key even when the sequence finished
    and was dropped in between (stage 0 learns of the end before the events are sent)."""
    bus = RecordingBus()
    publisher = TokenPublisher(bus, TokenEmitter(tokenizer, [], 8192))  # type: ignore[arg-type]
    key = bytes(range(32))
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    publisher.emitter.track(0, "r0", params, 3, [1, 2, 3], route=EventRoute(EventBox(key, "r0"), "00-t-s-01"))
    publisher.emitter.track(1, "r1", params, 3, [1, 2, 3])  # no key: plaintext events
    first = publisher.emit([(0, SampledToken(42)), (1, SampledToken(43))], batch_size=2, step_s=0.01)
    second = publisher.emit([(0, SampledToken(44))], batch_size=1, step_s=0.01)
    assert bus.sent == []
    assert [(r.seq_id, r.token_id, r.finish_reason) for r in first.results] == [(0, 42, ""), (1, 43, "")]
    assert [(r.seq_id, r.finish_reason) for r in second.results] == [(0, "length")]
    publisher.drop(0)  # stage 0 applied the end and freed the sequence before the events went
    asyncio.run(publisher.publish(first))
    asyncio.run(publisher.publish(second))
    assert [subject for subject, _ in bus.sent] == [names.token_subject(r) for r in ("r0", "r1", "r0")]
    opened = [EventBox(key, "r0").open(bus.sent[i][1]) for i in (0, 2)]
    events = [engine_pb2.TokenEvent.FromString(data) for data in (opened[0], bus.sent[1][1], opened[1])]
    assert [(e.request_id, e.index, e.token_id) for e in events] == [
        ("r0", 0, 42),
        ("r1", 0, 43),
        ("r0", 1, 44),
    ]
    assert events[2].finish_reason == "length" and events[2].usage.completion_tokens == 2
    assert all(e.sent_at > 0 for e in events)
    # the route's span rides on each event, to the last
    assert [e.traceparent for e in events] == ["00-t-s-01", "", "00-t-s-01"]
