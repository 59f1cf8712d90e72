"""The requests stage 0 holds off the work-queue stream, and the rule that drops orphans: plain
bookkeeping, no bus code.

Design. A request leaves the stream (ack) only when it has finished; while it runs, stage 0 holds
its message (`Delivery`) and keeps extending its ack deadline, and when the plan changes it hands
every held message back (nak). A request names the gateway process that waits for its tokens and
its deadline: one whose gateway is gone (`GatewayPresence`), or whose deadline passed more than
`ORPHAN_CHECK_S` ago, is an orphan (`HeldRequests.orphans`), which stage 0 cancels and acks, with
a 504 error event when its deadline passed. Stage 0's adapters (`head.py`, `intake.py`,
`upkeep.py`) move the messages; this table only remembers them and decides.
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


class HeldRequests:
    def __init__(self) -> None:
        self._held: dict[str, Delivery] = {}

    def __len__(self) -> int:
        return len(self._held)

    def get(self, request_id: str) -> Delivery | None:
        return self._held.get(request_id)

    def hold(self, request_id: str, delivery: Delivery) -> None:
        self._held[request_id] = delivery

    def release(self, request_id: str) -> Delivery | None:
        """Forget `request_id` (it ended, or was handed back); its delivery, if it was held."""
        return self._held.pop(request_id, None)

    def deliveries(self) -> list[Delivery]:
        """Every held request's delivery (a copy: the table may change while they are awaited)."""
        return list(self._held.values())

    def clear(self) -> None:
        self._held.clear()

    def ack_subjects(self, limit: int) -> list[str]:
        """Ack subjects of (at most `limit` of) the held requests, for the node's heartbeat."""
        return [d.msg.reply for d in itertools.islice(self._held.values(), limit) if d.msg.reply]

    def gateways(self) -> set[str]:
        """The gateway processes the held requests name (the ones whose presence to check)."""
        return {d.gateway for d in self._held.values() if d.gateway}

    def orphans(self, gone: Set[str], now: float) -> list[Orphan]:
        """The held requests whose gateway is in `gone`, or whose deadline passed more than
        `ORPHAN_CHECK_S` before `now` (unix seconds)."""
        found = []
        for request_id, delivery in self._held.items():
            late = delivery.deadline > 0 and now > delivery.deadline + ORPHAN_CHECK_S
            gateway_gone = delivery.gateway in gone
            if gateway_gone or late:
                found.append(Orphan(request_id, delivery, gateway_gone, late))
        return found
