"""The steps stage 0 has sent down the pipeline and waits for, each with its deadline: plain
bookkeeping on a clock the caller passes in, no bus code.

Design. Up to `max_inflight` steps (one per stage by default) are in flight at once: a sequence
waiting for its token sits out the next steps by itself, and each step takes at most its share of
the unfinished sequences, so the running set splits into micro-batches that keep every stage
busy. Every step sent has a deadline (`StepDeadlines`: a floor plus a multiple of the measured
round trip). A step whose result has not come by then (its frames were lost: a NATS server
restarted, a stage died mid-step) leaves the table at once (`overdue`), so a result that still
comes late finds nothing to take and is ignored (`returned` is None); its sequences, each once
(`overdue_sequences`), are resumed from the tokens the token stream holds for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mohawk_shard.engine.sequence import Sequence as Seq
from mohawk_shard.engine.stage import StepBatch
from mohawk_shard.node.step_deadlines import StepDeadlines


@dataclass(frozen=True, slots=True)
class InflightStep:
    batch: StepBatch
    started: float  # time.monotonic() when stage 0 began it


class StepsInFlight:
    def __init__(self, max_inflight: int, deadline_floor_s: float) -> None:
        self.max_inflight = max_inflight
        self.deadlines = StepDeadlines(floor_s=deadline_floor_s)
        self._steps: dict[int, InflightStep] = {}

    def __len__(self) -> int:
        return len(self._steps)

    def has_room(self) -> bool:
        """Whether another step may start now."""
        return len(self._steps) < self.max_inflight

    @property
    def num_expired(self) -> int:
        """Steps given up waiting for (their deadline passed)."""
        return self.deadlines.num_expired

    def sent(self, batch: StepBatch, started: float, now: float) -> None:
        """`batch`, begun at `started`, went down the pipeline at `now`: wait for its result."""
        self._steps[batch.step_id] = InflightStep(batch, started)
        self.deadlines.sent(batch.step_id, sum(s.num_new_tokens for s in batch.sequences), now)

    def returned(self, step_id: int, now: float) -> InflightStep | None:
        """The result of `step_id` came at `now`: its step, or None when it is not awaited (it
        expired already, or was never sent from here)."""
        step = self._steps.pop(step_id, None)
        if step is None or not self.deadlines.returned(step_id, now):
            return None
        return step

    def overdue(self, now: float) -> list[InflightStep]:
        """The steps past their deadline at `now`, oldest first; they are no longer awaited."""
        late = (self._steps.pop(step_id, None) for step_id in self.deadlines.overdue(now))
        return [step for step in late if step is not None]


def overdue_sequences(steps: Iterable[InflightStep], lookup: Callable[[int], Seq | None]) -> list[Seq]:
    """The sequences `steps` carried that still run (`lookup`: by sequence id), each once."""
    found: dict[int, Seq] = {}
    for step in steps:
        for item in step.batch.sequences:
            seq = lookup(item.seq_id)
            if seq is not None:
                found[seq.seq_id] = seq
    return list(found.values())
