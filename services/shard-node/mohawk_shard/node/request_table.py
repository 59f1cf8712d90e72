"""A request's life at stage 0, in one place: taken in, stepped, answered, cancelled, expired and
resumed, orphaned, handed back. Plain decisions over the engine core and the held records; every
operation returns the bus actions it needs (`bus_actions.py`) and awaits nothing, so a unit test
drives it with no NATS (tests/shard/node/test_request_table.py).

Design. The engine core (`EngineCore`) keeps each request's sequence (tokens, KV blocks, the
scheduler's queue) and calls `forget` whenever a sequence leaves it, for any reason; the held
records (`HeldRequests`) keep its work-queue message, token key, gateway, deadline and the
expiries in a row since its last token; the request's span is in `StageTraces` under the same
request id. `forget` is the one place the three let go of a request together, so no operation
below has to remember every map. The operations:
- `admit`: queue a checked request (with the tokens it emitted before, when it is redelivered),
  hold its message, open its span.
- `joining`: what the sampling stage must learn of each sequence that (re)joins a step.
- `apply`: a step's sampled tokens; a finished request's message is acked (its last event is out).
  A resumed request's first new token ends its resume: the time from being queued again to that
  token (the re-prefill of what its client has seen, served before new work) is recorded
  (`resumes`, on /metrics) and logged.
- `fail`: a step that could not run ends its requests with an error event (500).
- `cancel`: a client's cancel, if its tag is the request's; the message is acked.
- `expire`, then `resume`: a step whose deadline passed. Its sequence is freed and queued again
  from the tokens the token stream holds (the bus layer reads them between the two calls), unless
  it expired `max_resumes` times in a row with no token, which ends it (503).
- `orphans`: requests whose gateway is gone or whose deadline passed are cancelled and acked (a
  504 error event first when late).
- `hand_back`: the plan moved stage 0 elsewhere: every held message is naked for the next one.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass

import structlog

from mohawk_common.bus.requests import cancel_tag
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.engine.core import EngineCore
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.scheduler import Scheduler
from mohawk_shard.engine.sequence import QoS
from mohawk_shard.engine.sequence import Sequence as Seq
from mohawk_shard.engine.stage import StepBatch
from mohawk_shard.node.bus_actions import Ack, Action, Fail, Late, Nak
from mohawk_shard.node.held import Delivery, HeldRequests
from mohawk_shard.node.hops import HopStats
from mohawk_shard.node.traces import Attributes, StageTraces
from mohawk_shard.node.wire import Joining

log = structlog.get_logger("mohawk.shard.head")

NO_PROGRESS = "the pipeline gave no result for {} steps in a row; retry the request"


@dataclass(frozen=True, slots=True)
class Resume:
    """A request whose step expired, to be queued again once its emitted tokens are read."""

    seq: Seq
    delivery: Delivery
    expiries: int


class RequestTable:
    def __init__(
        self,
        scheduler: Scheduler,
        vocab_size: int,
        max_resumes: int,
        traces: StageTraces,
        on_forget: Callable[[Seq], None] | None = None,
        on_hold: Callable[[], None] | None = None,
        carried: Callable[[str, int], int] | None = None,
    ) -> None:
        """The table owns the engine core (which calls `forget` whenever a sequence leaves it) and
        the held records; `on_forget`: what else drops a sequence (the sampling stage's events);
        `on_hold`: told when a message is newly held (the node's heartbeat lists them);
        `carried`: the positions of a request's history (id, length) whose KV the node's stage
        carried over a re-plan (`Stage.num_carried`)."""
        self.core = EngineCore(scheduler, vocab_size=vocab_size, on_finish=self.forget)
        self.held = HeldRequests(max_resumes)
        self.traces = traces
        self._on_forget = on_forget
        self._on_hold = on_hold
        self._carried = carried
        self.resumes = HopStats()  # seconds from a resumed request's queueing to its next token

    def forget(self, seq: Seq) -> None:
        """The core let `seq` go (finished, cancelled, failed, expired): every record of it goes."""
        if self._on_forget is not None:
            self._on_forget(seq)
        self.traces.end(seq.request_id, {"mohawk.output_tokens": seq.num_output_tokens})
        self.held.release(seq.request_id)

    def admit(
        self,
        delivery: Delivery,
        request_id: str,
        prompt: Sequence[int],
        params: SamplingParams,
        emitted: Sequence[int],
        qos: QoS,
        span: Attributes | None = None,
    ) -> None:
        """Queue a checked request (`emitted`: its tokens so far, when redelivered) and hold it."""
        carried = self._carried(request_id, len(prompt) + len(emitted)) if emitted and self._carried else 0
        self.core.add_request(request_id, prompt, params, emitted, qos=qos, num_carried=carried)
        self.held.hold(request_id, delivery)
        if self._on_hold is not None:
            self._on_hold()
        if span is not None:
            self.traces.begin(request_id, delivery.traceparent, request_id, attributes=span)

    def joining(self, batch: StepBatch) -> dict[int, Joining]:
        """What the sampling stage needs of each sequence that (re)joins in `batch`."""
        joining: dict[int, Joining] = {}
        for s in batch.sequences:
            seq = self.core.sequence(s.seq_id)
            if s.new_sequence is None or seq is None:
                continue
            delivery = self.held.get(seq.request_id)
            token_key = delivery.token_key if delivery is not None else b""
            traceparent = self.traces.traceparent(seq.request_id)
            joining[s.seq_id] = Joining(seq.request_id, self.core.prompt_tail(seq), token_key, traceparent)
            if traceparent:
                self.traces.event(seq.request_id, "first step", {"mohawk.step_id": batch.step_id})
        return joining

    def apply(self, results: Iterable[bus_pb2.SampledResult]) -> list[Action]:
        """A step's sampled tokens; the finished requests' messages are acked."""
        actions: list[Action] = []
        for sampled in results:
            seq = self.core.sequence(sampled.seq_id)
            if seq is None:
                continue  # cancelled while its step was in flight
            delivery = self.held.get(seq.request_id)
            self.held.progressed(seq.request_id)
            if seq.resumed_at:
                self._caught_up(seq)
            self.core.apply_token(sampled.seq_id, sampled.token_id, finished=bool(sampled.finish_reason))
            if sampled.finish_reason and delivery is not None:
                actions.append(Ack(delivery.msg))
        return actions

    def _caught_up(self, seq: Seq) -> None:
        took = self.resumes.record(seq.resumed_at, time.monotonic()) or 0.0
        seq.resumed_at = 0.0
        log.info(
            "request caught up",
            request_id=seq.request_id,
            resume_ms=round(took * 1000, 1),
            replayed_tokens=seq.num_output_tokens,
        )

    def fail(self, batch: StepBatch, reason: str) -> list[Action]:
        """End every request of a step that could not run with an error event (500)."""
        actions: list[Action] = []
        for step in batch.sequences:
            seq = self.core.sequence(step.seq_id)
            if seq is None:
                continue
            delivery = self.held.get(seq.request_id)
            self.core.finish(seq)
            if delivery is not None:
                actions.append(Fail(delivery.msg, seq.request_id, reason, 500, delivery.box))
        return actions

    def cancel(self, request_id: str, tag: bytes) -> list[Action] | None:
        """A cancel for `request_id`: its message acked ([] if it is not held here); None when the
        tag is not the request's (a forged cancel: nothing changes)."""
        delivery = self.held.get(request_id)
        if delivery is None:
            return []
        if delivery.token_key and not hmac.compare_digest(tag, cancel_tag(delivery.token_key, request_id)):
            return None
        self.core.abort_request(request_id)
        return [Ack(delivery.msg)]

    def expire(self, seq: Seq) -> tuple[Resume | None, list[Action]]:
        """A step of `seq` expired: the resume to carry out once its emitted tokens are read, or
        none (it was not held, or it spent `max_resumes` in a row and ends with a 503)."""
        delivery = self.held.get(seq.request_id)
        if delivery is None:
            self.core.finish(seq)
            return None, []
        expiries = self.held.expired(seq.request_id)
        if expiries is None:
            self.core.finish(seq)
            reason = NO_PROGRESS.format(self.held.max_resumes)
            return None, [Fail(delivery.msg, seq.request_id, reason, 503, delivery.box)]
        return Resume(seq, delivery, expiries), []

    def resume(self, resume: Resume, emitted: Sequence[int], ended: bool) -> list[Action]:
        """Queue an expired request again from `emitted` (the token stream's), or ack it if its last
        event is already out. Nothing, if it was cancelled or ended while the stream was read."""
        seq, delivery = resume.seq, resume.delivery
        if self.core.sequence(seq.seq_id) is not seq:
            return []
        self.core.finish(seq)  # frees its KV blocks here and, with the next step, on every stage
        if ended:
            return [Ack(delivery.msg)]
        request_id = seq.request_id
        self.core.add_request(
            request_id, seq.token_ids[: seq.num_prompt_tokens], seq.params, emitted, qos=seq.qos
        )
        self.held.hold(request_id, delivery, expiries=resume.expiries)
        resumed = {"mohawk.resumed_from_token": len(emitted)}
        self.traces.begin(request_id, delivery.traceparent, request_id, attributes=resumed)
        return []

    def orphans(self, gone: Set[str], now: float) -> list[tuple[str, str, list[Action]]]:
        """Cancel the requests nobody waits for (`gone`: gateways whose presence lapsed; `now`:
        unix seconds): (request id, why, its actions) each."""
        found = []
        for orphan in self.held.orphans(gone, now):
            delivery = orphan.delivery
            self.core.abort_request(orphan.request_id)
            action: Action = (
                Late(delivery.msg, orphan.request_id, delivery.box) if orphan.late else Ack(delivery.msg)
            )
            found.append((orphan.request_id, orphan.reason, [action]))
        return found

    def hand_back(self) -> list[Action]:
        """Every held message back to the stream for the next stage 0; the records go."""
        actions: list[Action] = [Nak(d.msg) for d in self.held.deliveries()]
        self.held.clear()
        return actions
