"""The gateway's room for generation requests, in one place: its counters, its rule and its 429.

Design. A generation request is counted three ways on its way in, each for a reason:
- `num_active`: inside the app, counted by `AdmissionMiddleware` from the moment it is let in
  until its answer is sent. The door's check reads it, so a burst that arrives as room frees up is
  refused before a trip through the app (JSON, chat template, tokenizer), not after one.
- `num_tokenizing`: its prompt is being tokenized (`tokenizing()`, around the tokenizer call).
- `num_in_flight`: submitted on the bus and not yet closed (`take_slot()` at submission, the
  `Slot`'s `release()` when its generation closes).
The room rule: the door lets a request in while `num_active < max_in_flight` and
`num_in_flight + num_tokenizing < max_in_flight` (`has_room`); tokenizing starts only while
`has_room()`; submission takes a slot only while `num_in_flight < max_in_flight`. Every refusal is
the same 429 with Retry-After (`refusal()`; the middleware sends `error_body`, encoded once). Session
turns go through the same routes, so the same counters.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from mohawk_gateway.errors import GatewayError, too_many_requests

OVERLOADED = "too many requests in flight; retry later"


class Slot:
    """One in-flight request's hold on the room; `release()` gives it back, once."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission.num_in_flight -= 1
            self._admission = None


@dataclass(frozen=True, slots=True)
class BurstHold:
    """How long the middleware holds an admitted request back while a burst is being refused
    (`AdmissionMiddleware._refusals_first`): `first_look_s` always, then while refusals come less
    than `quiet_s` apart, `max_hold_s` at most; zeros: never. The gateway's settings give them."""

    first_look_s: float
    quiet_s: float
    max_hold_s: float


class Admission:
    def __init__(self, max_in_flight: int, retry_after_s: int, hold: BurstHold) -> None:
        self.max_in_flight = max_in_flight
        self.retry_after_s = retry_after_s
        self.hold = hold
        self.num_active = 0
        self.num_tokenizing = 0
        self.num_in_flight = 0
        self.error: GatewayError = self.refusal()  # the middleware's pre-encoded copy
        self.error_body: bytes = json.dumps(self.error.body()).encode()

    def refusal(self) -> GatewayError:
        """The 429 every path answers (a fresh one each time: a raised exception keeps its traceback)."""
        return too_many_requests("gateway_full", OVERLOADED, retry_after_s=self.retry_after_s)

    def has_room(self) -> bool:
        """Whether the requests in flight and those being tokenized leave room for one more."""
        return self.num_in_flight + self.num_tokenizing < self.max_in_flight

    def door_open(self) -> bool:
        """Whether the middleware lets one more generation request into the app."""
        return self.num_active < self.max_in_flight and self.has_room()

    def check_room(self) -> None:
        """The 429 at once when there is no room (`has_room`)."""
        if not self.has_room():
            raise self.refusal()

    @contextmanager
    def inside(self) -> Iterator[None]:
        """Count a request let in at the door until its answer is sent."""
        self.num_active += 1
        try:
            yield
        finally:
            self.num_active -= 1

    @contextmanager
    def tokenizing(self) -> Iterator[None]:
        """Check the room (429 without it), then count a prompt being tokenized."""
        self.check_room()
        self.num_tokenizing += 1
        try:
            yield
        finally:
            self.num_tokenizing -= 1

    def take_slot(self) -> Slot:
        """Hold room for a request being submitted (429 when every slot is taken): held from here,
        so requests admitted at once cannot overshoot."""
        if self.num_in_flight >= self.max_in_flight:
            raise self.refusal()
        self.num_in_flight += 1
        return Slot(self)
