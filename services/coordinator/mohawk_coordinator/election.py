"""Leader election: one lease key in a NATS KV bucket whose TTL is the lease.

Design. The leader bucket keeps each value for `ttl` seconds (its max age) and one revision per
key, so the lease key exists only while its holder keeps rewriting it (value: the holder's id). A
candidate takes the lease with `create` (which succeeds only when the key is absent, expired or
deleted); the holder renews it every ttl/3 with `update(last=revision)`, a compare-and-set on the
revision, so a renewal after anyone else wrote the key fails and the holder steps down at once.
The holder also stops calling itself leader `ttl` after it *sent* its last successful renewal,
before the server can have expired the key, so two replicas never both believe they lead.
Standbys poll every ttl/10. The server's expiry timer runs a little late (≈0.25 s measured), so a
standby also takes over, by compare-and-set, a lease whose revision it has seen unchanged for a
full ttl since the poll that first returned it: that lease was written at least ttl ago, and its
holder has given it up by its own clock. The standby polls again exactly when that ttl runs out,
so failover after a crash takes at most ttl + one poll after the holder's last renewal; a
graceful stop deletes the lease (only if still held), and a standby takes over within one poll.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from mohawk_common.bus import names

log = structlog.get_logger("mohawk.coordinator.election")

RENEWALS_PER_TTL = 3
POLLS_PER_TTL = 10
T = TypeVar("T")


class LeaderElection:
    """Campaign for, hold and give up the coordinator lease; `is_leader` says whether we hold it."""

    def __init__(
        self,
        kv: KeyValue,
        candidate_id: str,
        ttl_s: float,
        *,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kv = kv
        self.candidate_id = candidate_id
        self.ttl_s = ttl_s
        self.renew_interval_s = ttl_s / RENEWALS_PER_TTL
        self.poll_interval_s = ttl_s / POLLS_PER_TTL
        self._on_change = on_change
        self._clock = clock
        self._revision: int | None = None
        self._deadline = 0.0
        self._num_terms = 0
        self._seen: tuple[int, float] | None = None  # another holder's revision and when first seen
        self._seen_holder: str | None = None
        self._log = log.bind(coordinator_id=candidate_id)

    @property
    def is_leader(self) -> bool:
        return self._revision is not None and self._clock() < self._deadline

    @property
    def term(self) -> int:
        """How many times this replica has become leader; a new term means start leading afresh."""
        return self._num_terms

    @property
    def revision(self) -> int | None:
        return self._revision

    async def run(self) -> None:
        """Campaign while a standby, renew while leader, until cancelled."""
        while True:
            if self._revision is None:
                await self.campaign()
            else:
                await self.renew()
            await asyncio.sleep(self._next_delay())

    async def campaign(self) -> bool:
        """One standby poll: take the lease if it is free or has gone unrenewed for a whole TTL."""
        try:
            entry = await self._call(self.kv.get(names.LEADER_KEY))
        except KeyNotFoundError:  # absent, expired or released
            return await self._acquire(last=0)
        except (NatsError, TimeoutError) as exc:
            self._log.debug("lease poll failed", error=str(exc) or type(exc).__name__)
            return False
        now = self._clock()  # after the answer: the revision was written before this instant
        holder = (entry.value or b"").decode(errors="replace")
        if holder != self._seen_holder:
            self._seen_holder = holder
            self._log.info("leader observed", leader=holder)
        revision = entry.revision or 0
        if self._seen is None or self._seen[0] != revision:
            self._seen = (revision, now)
            return False
        if now - self._seen[1] < self.ttl_s:
            return False
        self._log.info("lease unrenewed for a full ttl, taking it over", previous_leader=holder)
        return await self._acquire(last=revision)

    async def renew(self) -> bool:
        """Rewrite the lease by compare-and-set; any failure to prove we still hold it steps down."""
        if self._revision is None:
            return False
        sent = self._clock()
        if sent >= self._deadline:
            self._step_down("lease ran out before it could be renewed")
            return False
        try:
            revision = await self._call(
                self.kv.update(names.LEADER_KEY, self.candidate_id.encode(), last=self._revision)
            )
        except KeyWrongLastSequenceError:
            self._step_down("lease was taken over or expired (compare-and-set on its revision failed)")
            return False
        except (NatsError, TimeoutError) as exc:
            self._log.warning("lease renewal failed", error=str(exc) or type(exc).__name__)
            if self._clock() >= self._deadline:
                self._step_down("lease ran out while renewals failed")
            return False
        self._revision = revision
        self._deadline = sent + self.ttl_s
        return True

    async def verify(self) -> bool:
        """Check with the server that the lease is still ours (before writing a plan)."""
        if not self.is_leader:
            return False
        try:
            entry = await self._call(self.kv.get(names.LEADER_KEY))
        except KeyNotFoundError:
            self._step_down("lease is gone")
            return False
        except (NatsError, TimeoutError):
            return False
        if entry.revision != self._revision:
            self._step_down("lease was taken over")
            return False
        return self.is_leader

    async def release(self) -> None:
        """Give the lease up (graceful stop): delete it if it still holds our revision."""
        revision = self._revision
        if revision is None:
            return
        self._revision = None
        try:
            await self._call(self.kv.delete(names.LEADER_KEY, last=revision))
        except (NatsError, TimeoutError) as exc:
            self._log.info("lease not deleted (it will expire)", error=str(exc) or type(exc).__name__)
        self._log.info("leadership released")
        self._notify(False)

    def _next_delay(self) -> float:
        """Renew every ttl/3; poll every ttl/10, or sooner when a seen lease runs out before then."""
        if self._revision is not None:
            return self.renew_interval_s
        if self._seen is None:
            return self.poll_interval_s
        expires_in = self._seen[1] + self.ttl_s - self._clock()
        return min(self.poll_interval_s, max(expires_in, 0.0))

    async def _acquire(self, *, last: int) -> bool:
        sent = self._clock()
        value = self.candidate_id.encode()
        try:
            if last:
                revision = await self._call(self.kv.update(names.LEADER_KEY, value, last=last))
            else:
                revision = await self._call(self.kv.create(names.LEADER_KEY, value))
        except KeyWrongLastSequenceError:
            return False  # another standby was faster
        except (NatsError, TimeoutError) as exc:
            self._log.debug("lease acquisition failed", error=str(exc) or type(exc).__name__)
            return False
        self._revision = revision
        self._deadline = sent + self.ttl_s
        self._num_terms += 1
        self._seen = None
        self._seen_holder = self.candidate_id
        self._log.info("leadership acquired", term=self._num_terms, lease_ttl_s=self.ttl_s)
        self._notify(True)
        return True

    def _step_down(self, reason: str) -> None:
        self._revision = None
        self._seen = None
        self._seen_holder = None
        self._log.warning("leadership lost, stepping down", reason=reason)
        self._notify(False)

    def _notify(self, leading: bool) -> None:
        if self._on_change is not None:
            self._on_change(leading)

    async def _call(self, operation: Awaitable[T]) -> T:
        """A KV call bounded by one renewal interval, so a stalled server cannot outlast the lease.

        `asyncio.timeout`, not `wait_for`: on Python 3.11 `wait_for` swallows a cancellation that
        lands as the call completes, and the cancelled campaign loop then ran on, so a stopping
        coordinator waited on it forever (seen as a SIGTERM that never ended the process)."""
        async with asyncio.timeout(self.renew_interval_s):
            return await operation
