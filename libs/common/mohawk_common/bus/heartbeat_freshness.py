"""Fresh heartbeats only: a signed heartbeat replayed later does not keep its node alive.

Design. A shard node's heartbeat is signed by its certificate, so nobody can forge one; but
anyone who may subscribe to heartbeats can record one and publish it again, and before this a
reader took it as the node being alive: a replayed heartbeat kept a stopped node in the plan
(measured: still planned 5 s after it stopped, node timeout 0.6 s). So each heartbeat carries,
inside what is signed, its incarnation (`started_at_ms`), a `sequence` that counts up from 1
within it, and the time it was sent. A reader keeps the last (incarnation, sequence) it admitted
from each node and refuses (`replayed`) one that is not above it: a lower or equal sequence of
the same incarnation, or an earlier incarnation. A reader that has seen nothing of a node yet (it
just started) has no sequence to compare, so the time bounds it instead: a heartbeat sent more
than `WINDOW_S` before or after the reader's clock is refused (`stale`); the window is that wide
because hosts' clocks differ (as the gateways' presence records allow). One table per reader,
an entry per certified node id (the signature is checked first, so strangers add no entries).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mohawk_common.bus.control_records import RecordVerifier
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2

WINDOW_S = 15.0  # how far a heartbeat's time may be from the reader's clock


class HeartbeatFreshness:
    def __init__(self, *, window_s: float = WINDOW_S, clock: Callable[[], float] = time.time) -> None:
        self.window_s = window_s
        self.clock = clock  # unix seconds, as `sent_at` is
        self._last: dict[str, tuple[int, int]] = {}  # node id -> (incarnation, sequence)

    def verify(self, verifier: RecordVerifier, heartbeat: bus_pb2.Heartbeat) -> None:
        """`heartbeat` signed by its node (`verifier`) and fresh (`admit`); AuthenticationError
        otherwise. A process that enforces no signatures (insecure) checks neither: anyone could
        forge a heartbeat there, so a replay is no news."""
        verifier.verify(heartbeat, "heartbeat")
        if verifier.enforcing:
            self.admit(heartbeat)

    def admit(self, heartbeat: bus_pb2.Heartbeat) -> None:
        """Take `heartbeat` (signature already verified) as the node's latest; AuthenticationError
        ("stale" or "replayed") when it is not fresh, and then nothing is remembered of it."""
        skew = heartbeat.sent_at - self.clock()
        if abs(skew) > self.window_s:
            raise AuthenticationError(
                "stale", f"heartbeat of {heartbeat.node_id} sent {skew:+.1f} s from this clock"
            )
        order = (heartbeat.started_at_ms, heartbeat.sequence)
        last = self._last.get(heartbeat.node_id)
        if last is not None and order <= last:
            raise AuthenticationError(
                "replayed", f"heartbeat {order} of {heartbeat.node_id} is not after {last}, already seen"
            )
        self._last[heartbeat.node_id] = order
