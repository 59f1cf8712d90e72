"""The sampling end of a pipeline: sampled tokens become token events for the gateway and results for stage 0.

The last stage publishes each event on `mohawk.v1.tok.<request>` (core NATS, captured by the
MOHAWK_TOKENS stream, which is also the record a new stage 0 replays after a recovery) and hands
back to stage 0 only what the scheduler needs: the token and whether the sequence ended. Events
of a request that came with a token key are encrypted with it (`EventBox`); only the gateway that
made the key (and a stage 0 that opened the sealed request) can read them. Every event says how
many sequences its step ran (`batch_size`) and whether the step, timed from when stage 0 began it
(its `started_at`, wall clock: nodes' clocks are assumed in sync, as the hop latencies assume),
overran the request's latency budget (`budget_missed`), when it was published (`sent_at`, the
gateway's hop time) and, when the request is traced, this stage's span (`traceparent`), which the
gateway's token span is the child of.

A step's events leave after its results: what stage 0 needs to start the next step (the tokens and
which sequences ended, decided here by the emitter's stop rules) is made first, sent, and only then
are the events encoded, sealed and published (`SampledStep`), so their work is off the path from
one token to the next (on SmolLM2-1.7B through two nodes it was about half the last stage's event
loop work per token). A token the results carry but whose event is lost with a dying stage is not
lost: a resumed request continues from the token stream, which re-decodes it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from nats.aio.client import Client

from mohawk_common.bus import names
from mohawk_pqc.seal import EventBox
from mohawk_proto.v1 import bus_pb2, engine_pb2
from mohawk_shard.engine.emitter import TokenEmitter
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.request_output import RequestOutput
from mohawk_shard.engine.stage import StageOutput, StepBatch
from mohawk_shard.node.wire import Joining


def token_event(event: RequestOutput) -> engine_pb2.TokenEvent:
    message = engine_pb2.TokenEvent(
        request_id=event.request_id,
        index=event.index,
        token_id=event.token_id if event.token_id is not None else 0,
        text=event.text,
        finish_reason=event.finish_reason or "",
        batch_size=event.batch_size,
        budget_missed=event.budget_missed,
    )
    if event.logprob is not None:
        message.logprob = event.logprob
        message.top_logprobs.extend(
            engine_pb2.TopLogprob(token_id=t, logprob=p) for t, p in event.top_logprobs
        )
    if event.finish_reason is not None:
        message.usage.CopyFrom(
            engine_pb2.Usage(
                prompt_tokens=event.num_prompt_tokens,
                completion_tokens=event.num_output_tokens,
                total_tokens=event.num_prompt_tokens + event.num_output_tokens,
                cached_tokens=event.num_cached_tokens,
            )
        )
    return message


def event_box(request_id: str, token_key: bytes) -> EventBox | None:
    return EventBox(token_key, request_id) if token_key else None


def encode_event(event: engine_pb2.TokenEvent, box: EventBox | None) -> bytes:
    data = event.SerializeToString()
    return data if box is None else box.seal(data)


async def publish_error(nc: Client, request_id: str, message: str, status: int, box: EventBox | None) -> None:
    """End a request with an error the gateway turns into an OpenAI error body."""
    event = engine_pb2.TokenEvent(
        request_id=request_id, index=0, finish_reason="error", error=message, error_status=status
    )
    await nc.publish(names.token_subject(request_id), encode_event(event, box))


@dataclass(frozen=True, slots=True)
class EventRoute:
    """Where a sequence's token events go, kept in its emitter record: the request's event box
    (None: plaintext) and this stage's span of it ("" when not traced)."""

    box: EventBox | None
    traceparent: str = ""


@dataclass
class SampledStep:
    """What a step sampled: the results stage 0 applies, and the token events for the gateway."""

    results: list[bus_pb2.SampledResult] = field(default_factory=list)
    events: list[tuple[engine_pb2.TokenEvent, EventBox | None]] = field(default_factory=list)


class TokenPublisher:
    """The last stage's sequences, one emitter record each (text, stop rules, counts and the
    `EventRoute`), and the bus they are published on."""

    def __init__(self, nc: Client, emitter: TokenEmitter[EventRoute]) -> None:
        self.nc = nc
        self.emitter = emitter

    def drop(self, seq_id: int) -> None:
        self.emitter.drop(seq_id)

    def follow(self, batch: StepBatch, joining: Mapping[int, Joining]) -> None:
        """Drop freed sequences and start tracking the ones that join in `batch`."""
        for seq_id in batch.freed_seq_ids:
            self.drop(seq_id)
        for step in batch.sequences:
            spec = step.new_sequence
            if spec is not None and step.seq_id in joining:
                joined = joining[step.seq_id]
                self.emitter.track(
                    step.seq_id,
                    joined.request_id,
                    spec.params,
                    spec.num_prompt_tokens,
                    joined.prompt_tail,
                    spec.output_token_ids,
                    spec.num_cached_tokens,
                    spec.latency_budget_ms,
                    route=EventRoute(event_box(joined.request_id, joined.token_key), joined.traceparent),
                )

    async def sample_step(
        self,
        batch: StepBatch,
        joining: Mapping[int, Joining],
        compute: Callable[[], Awaitable[StageOutput]],
        started_at: float,
    ) -> SampledStep:
        """The last stage's share of a step, whichever stage index it is: follow the sequences that
        join or leave in `batch`, run the stage (`compute`), and make the results and token events
        of what it sampled (`started_at`: unix seconds stage 0 began the step); the caller sends
        the results, then `publish`es the events."""
        self.follow(batch, joining)
        output = await compute()
        step_s = max(0.0, time.time() - started_at)
        return self.emit(output.sampled, len(batch.sequences), step_s)

    def emit(
        self, sampled: Sequence[tuple[int, SampledToken]], batch_size: int, step_s: float
    ) -> SampledStep:
        """The results and events of the tokens sampled by a step of `batch_size` sequences,
        `step_s` long (each event keeps its box: its sequence may be dropped before it is sent)."""
        step = SampledStep()
        for seq_id, token in sampled:
            route = self.emitter.route(seq_id) or EventRoute(None)  # read first: an end drops it
            event = self.emitter.emit(seq_id, token, batch_size=batch_size, step_s=step_s)
            if event is None:
                continue
            message = token_event(event)
            message.traceparent = route.traceparent
            step.events.append((message, route.box))
            step.results.append(
                bus_pb2.SampledResult(
                    seq_id=seq_id, token_id=token.token_id, finish_reason=event.finish_reason or ""
                )
            )
        return step

    async def publish(self, step: SampledStep) -> None:
        """Send a step's token events, in order."""
        for message, box in step.events:
            message.sent_at = time.time()
            await self.nc.publish(names.token_subject(message.request_id), encode_event(message, box))
