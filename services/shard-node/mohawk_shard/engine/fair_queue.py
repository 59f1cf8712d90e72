"""Fair share for stage 0's scheduler: strict priority classes, weighted fair queuing of tenants.

Design (start-time fair queuing on a virtual token counter, as in Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024). Priority classes are strict: high is served before
normal, normal before low. Inside a class, tenants share the pipeline by weight: each tenant has a
virtual time that advances by the tokens computed for it divided by its weight (prompt chunks and
decoded tokens alike; prefix-cache hits cost nothing), and whoever has the smallest virtual time
is served next, so while tenants stay busy the tokens they get are in proportion to their weights.
The class's system virtual time is the largest virtual time a tenant had when it was served; a
tenant that had nothing queued or running re-enters at the larger of its own virtual time and the
system virtual time, so idling banks no credit (and leaving does not forgive a lead). A tenant
that had sequences running but none queued is not backlogged either: when new work of it is
queued, its virtual time is lifted to at least the smallest of the tenants already queued (as the
VTC paper lifts a client that joins the waiting queue), or to the system virtual time when no one
is queued (no one waits, so no one is owed anything). Without that, a tenant kept short of work
(its clients refused by the gateway's admission, say) trailed while others used the room it left,
and once its queue filled again it took everything until it caught up: in a load test with
admission by predicted wait, a weight-1 tenant got no token for a second and its requests waited
20-28 s while a weight-3 tenant caught up. The empty-queue case came later: under the same load
test a weight-1 tenant was served 7-11 first tokens a second while the others' clients were away,
its queue emptying between arrivals; the others, each with sequences running, joined that empty
queue unlifted, far behind, and once their clients were back the weight-1 tenant got no first
token for 6 s. The same
order decides two things: which waiting sequence is admitted next (`FairQueue`: first in, first
out within a tenant; a preempted sequence goes back to the head of its tenant's queue, and a
resumed one, whose client has already seen tokens, goes ahead of the tenant's new work, behind the
resumed ones before it), and which
ready running sequences get into a step that cannot take all of them (`TenantClocks.order`).
Sequences of the default `QoS` (one anonymous tenant, normal priority) keep arrival order.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from mohawk_shard.engine.sequence import Priority, Sequence


@dataclass(slots=True)
class _Tenant:
    vtime: float = 0.0
    seq_ids: set[int] = field(default_factory=set)  # its sequences queued or running


@dataclass(slots=True)
class _Class:
    tenants: dict[str, _Tenant] = field(default_factory=dict)
    clock: float = 0.0  # the system virtual time


class TenantClocks:
    """The virtual time of every tenant with work, per priority class."""

    def __init__(self) -> None:
        self._classes = {priority: _Class() for priority in Priority}

    def join(self, seq: Sequence) -> None:
        """`seq` is queued: a tenant that had no work re-enters at the system virtual time."""
        klass = self._classes[seq.qos.priority]
        tenant = klass.tenants.setdefault(seq.qos.tenant, _Tenant(klass.clock))
        if not tenant.seq_ids:
            tenant.vtime = max(tenant.vtime, klass.clock)
        tenant.seq_ids.add(seq.seq_id)

    def leave(self, seq: Sequence) -> None:
        """`seq` is gone; a tenant left with no work and no lead is forgotten."""
        klass = self._classes[seq.qos.priority]
        tenant = klass.tenants.get(seq.qos.tenant)
        if tenant is None:
            return
        tenant.seq_ids.discard(seq.seq_id)
        if not tenant.seq_ids and tenant.vtime <= klass.clock:
            del klass.tenants[seq.qos.tenant]

    def charge(self, seq: Sequence, num_tokens: int) -> None:
        """`num_tokens` of `seq` were scheduled: its tenant's virtual time advances by tokens / weight."""
        klass = self._classes[seq.qos.priority]
        tenant = klass.tenants.setdefault(seq.qos.tenant, _Tenant(klass.clock))
        klass.clock = max(klass.clock, tenant.vtime)
        tenant.vtime += num_tokens / seq.qos.weight

    def system_vtime(self, priority: Priority) -> float:
        """The class's system virtual time: the largest virtual time a tenant had when served."""
        return self._classes[priority].clock

    def lift(self, seq: Sequence, floor: float) -> None:
        """`seq`'s tenant's virtual time is at least `floor`."""
        tenant = self._classes[seq.qos.priority].tenants.get(seq.qos.tenant)
        if tenant is not None:
            tenant.vtime = max(tenant.vtime, floor)

    def vtime(self, priority: Priority, tenant: str) -> float:
        klass = self._classes[priority]
        known = klass.tenants.get(tenant)
        return klass.clock if known is None else known.vtime

    def order(self, seqs: list[Sequence], cost: Callable[[Sequence], int]) -> list[Sequence]:
        """`seqs` in the order fair share serves them: classes strictly, then smallest virtual time,
        each pick advancing its tenant by `cost(seq)` / weight (simulated: nothing is charged).
        Each tenant's sequences keep their order in `seqs`."""
        queues: dict[tuple[Priority, str], deque[Sequence]] = {}
        for seq in seqs:
            queues.setdefault((seq.qos.priority, seq.qos.tenant), deque()).append(seq)
        heap = [(key[0], self.vtime(*key), rank, key) for rank, key in enumerate(queues)]
        heapq.heapify(heap)
        ordered: list[Sequence] = []
        while heap:
            priority, vtime, rank, key = heapq.heappop(heap)
            seq = queues[key].popleft()
            ordered.append(seq)
            if queues[key]:
                heapq.heappush(heap, (priority, vtime + cost(seq) / seq.qos.weight, rank, key))
        return ordered


class FairQueue:
    """The waiting sequences, first in first out per (class, tenant), handed out in fair order."""

    def __init__(self, clocks: TenantClocks) -> None:
        self.clocks = clocks
        self._queues: dict[Priority, dict[str, deque[Sequence]]] = {p: {} for p in Priority}
        self._num_waiting = 0
        self._resumed: set[int] = set()  # seq ids queued by `append_resumed`

    def __len__(self) -> int:
        return self._num_waiting

    @property
    def num_new(self) -> int:
        """Sequences waiting that are not resumed ones (work not taken in before)."""
        return self._num_waiting - len(self._resumed)

    def __bool__(self) -> bool:
        return self._num_waiting > 0

    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, Sequence):
            return False
        queue = self._queues[seq.qos.priority].get(seq.qos.tenant)
        return queue is not None and seq in queue

    def __iter__(self) -> Iterator[Sequence]:
        """Class by class, tenants by virtual time, each tenant's queue in order."""
        for priority in Priority:
            tenants = self._queues[priority]
            for name in sorted(tenants, key=lambda t: self.clocks.vtime(priority, t)):
                yield from tenants[name]

    def append(self, seq: Sequence) -> None:
        self._lift_if_new(seq)
        self._queue(seq).append(seq)
        self._num_waiting += 1

    def appendleft(self, seq: Sequence) -> None:
        """Back to the head of its tenant's queue (a preempted sequence)."""
        self._queue(seq).appendleft(seq)
        self._num_waiting += 1

    def append_resumed(self, seq: Sequence) -> None:
        """Ahead of its tenant's new work, behind the resumed sequences already waiting."""
        self._lift_if_new(seq)
        queue = self._queue(seq)
        ahead = next((i for i, waiting in enumerate(queue) if not waiting.resumed_at), len(queue))
        queue.insert(ahead, seq)
        self._num_waiting += 1
        self._resumed.add(seq.seq_id)

    def peek(self) -> Sequence | None:
        """The sequence to admit next: the highest class with any waiting, the tenant of smallest
        virtual time in it (the earlier tenant on a tie), the head of that tenant's queue."""
        for priority in Priority:
            tenants = self._queues[priority]
            if tenants:
                name = min(tenants, key=lambda t: self.clocks.vtime(priority, t))
                return tenants[name][0]
        return None

    def remove(self, seq: Sequence) -> None:
        tenants = self._queues[seq.qos.priority]
        queue = tenants[seq.qos.tenant]
        queue.remove(seq)
        self._num_waiting -= 1
        self._resumed.discard(seq.seq_id)
        if not queue:
            del tenants[seq.qos.tenant]

    def _lift_if_new(self, seq: Sequence) -> None:
        """A tenant with nothing queued joins the queue no further behind than the least of the
        tenants queued, or than the system virtual time when none is (a preempted sequence, put
        back with `appendleft`, is not new work)."""
        priority, tenants = seq.qos.priority, self._queues[seq.qos.priority]
        if seq.qos.tenant not in tenants:
            least = (self.clocks.vtime(priority, t) for t in tenants)
            self.clocks.lift(seq, min(least, default=self.clocks.system_vtime(priority)))

    def _queue(self, seq: Sequence) -> deque[Sequence]:
        return self._queues[seq.qos.priority].setdefault(seq.qos.tenant, deque())
