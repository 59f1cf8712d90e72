"""The requests stage 0 holds off the work-queue stream, one record each (`RequestState`: its
message and token key, and how many of its steps expired in a row), the rule that drops orphans
and the one that ends a request that makes no progress: plain bookkeeping, no bus code.

Design. A request leaves the stream (ack) only when it has finished; while it runs, stage 0 holds
its message (`Delivery`) and keeps extending its ack deadline, and when the plan changes it hands
every held message back (nak). A request names the gateway process that waits for its tokens and
its deadline: one whose gateway is gone (`GatewayPresence`), or whose deadline passed more than
`ORPHAN_CHECK_S` ago, is an orphan (`HeldRequests.orphans`), which stage 0 cancels and acks, with
a 504 error event when its deadline passed. A step given up (its deadline passed: frames lost, a
stage died) frees its sequences and resumes them from the tokens the token stream holds; a request
that keeps expiring with no token in between would loop for ever, so after `max_resumes` such
resumes in a row its next expiry ends it with an error (`expired`), and any token starts its count
again (`progressed`). A record leaves with its request (`release`), its count with it. What
happens to a request is `request_table.py`'s; this table only remembers the records it reads.
"""

from __future__ import annotations

import itertools
from collections.abc import Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mohawk_shard.node.gateways import ORPHAN_CHECK_S

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from mohawk_pqc.seal import EventBox


@dataclass(frozen=True, slots=True)
class Delivery:
    """A running request's bus side: its message on the work queue and its token-event key."""

    msg: Msg
    token_key: bytes
    box: EventBox | None
    gateway: str = ""  # the submitting gateway process ("" = not tracked)
    deadline: float = 0.0  # unix seconds; 0 = none
    traceparent: str = ""  # the gateway's span of the request ("" = not traced)


@dataclass(frozen=True, slots=True)
class Orphan:
    """A held request nobody waits for any more."""

    request_id: str
    delivery: Delivery
    gateway_gone: bool
    late: bool  # its deadline passed (its client gets a 504 error event)

    @property
    def reason(self) -> str:
        return "its gateway is gone" if self.gateway_gone else "its deadline passed"


@dataclass(slots=True)
class RequestState:
    """One held request: its bus side, and its steps expired since its last token."""

    delivery: Delivery
    expiries: int = 0


class HeldRequests:
    def __init__(self, max_resumes: int) -> None:
        self.max_resumes = max_resumes
        self._states: dict[str, RequestState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def get(self, request_id: str) -> Delivery | None:
        state = self._states.get(request_id)
        return None if state is None else state.delivery

    def hold(self, request_id: str, delivery: Delivery, *, expiries: int = 0) -> None:
        """Hold `request_id`'s message (`expiries`: its count so far, when it is resumed)."""
        self._states[request_id] = RequestState(delivery, expiries)

    def release(self, request_id: str) -> Delivery | None:
        """Forget `request_id` (it ended, or was handed back); its delivery, if it was held."""
        state = self._states.pop(request_id, None)
        return None if state is None else state.delivery

    def deliveries(self) -> list[Delivery]:
        """Every held request's delivery (a copy: the table may change while they are awaited)."""
        return [state.delivery for state in self._states.values()]

    def expired(self, request_id: str) -> int | None:
        """A step of `request_id` expired: the count of expiries in a row to hold it with when it is
        resumed, or None when `max_resumes` are spent and the request must end."""
        state = self._states.get(request_id)
        count = (state.expiries if state is not None else 0) + 1
        return None if count > self.max_resumes else count

    def progressed(self, request_id: str) -> None:
        """`request_id` got a token: its next expiry counts from one again."""
        state = self._states.get(request_id)
        if state is not None:
            state.expiries = 0

    def clear(self) -> None:
        self._states.clear()

    def ack_subjects(self, limit: int) -> list[str]:
        """Ack subjects of (at most `limit` of) the held requests, for the node's heartbeat."""
        held = (state.delivery for state in self._states.values())
        return [d.msg.reply for d in itertools.islice(held, limit) if d.msg.reply]

    def gateways(self) -> set[str]:
        """The gateway processes the held requests name (the ones whose presence to check)."""
        return {s.delivery.gateway for s in self._states.values() if s.delivery.gateway}

    def orphans(self, gone: Set[str], now: float) -> list[Orphan]:
        """The held requests whose gateway is in `gone`, or whose deadline passed more than
        `ORPHAN_CHECK_S` before `now` (unix seconds)."""
        found = []
        for request_id, state in self._states.items():
            delivery = state.delivery
            late = delivery.deadline > 0 and now > delivery.deadline + ORPHAN_CHECK_S
            gateway_gone = delivery.gateway in gone
            if gateway_gone or late:
                found.append(Orphan(request_id, delivery, gateway_gone, late))
        return found
