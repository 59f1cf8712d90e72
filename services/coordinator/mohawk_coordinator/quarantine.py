"""Quarantine: a node whose steps keep failing is left out of plans for a cool-down.

Design. Nodes report in every heartbeat how many steps they could not run since they started
(`failed_steps`: an exception in their own compute, a stage that cannot load its input). The
leader turns the increases into failure times per node (a new `started_at_ms` is a new process
and restarts its count). `threshold` failures within `window_s` put the node in quarantine until
`cool_down_s` later: the planner then treats it as absent, so the next plan runs on the others
and the node rejoins by itself when the cool-down ends (its failures are forgotten then, so one
more failure does not send it straight back). A node is never quarantined when that would leave
no live node for the model: a pipeline that fails sometimes beats no pipeline. Pure bookkeeping
on the caller's clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import structlog

from mohawk_proto.v1 import bus_pb2

log = structlog.get_logger("mohawk.coordinator.quarantine")


@dataclass(slots=True)
class _Record:
    started_at_ms: int
    failed_steps: int
    failures: deque[float] = field(default_factory=deque)
    until: float = 0.0


class Quarantine:
    def __init__(
        self,
        clock: Callable[[], float],
        threshold: int = 3,
        window_s: float = 60.0,
        cool_down_s: float = 120.0,
    ) -> None:
        self.clock, self.threshold, self.window_s, self.cool_down_s = clock, threshold, window_s, cool_down_s
        self._nodes: dict[str, _Record] = {}

    def observe(self, heartbeat: bus_pb2.Heartbeat) -> None:
        """Count the failures a heartbeat reports since the node's previous one."""
        now = self.clock()
        record = self._nodes.get(heartbeat.node_id)
        if record is None or record.started_at_ms != heartbeat.started_at_ms:
            until = record.until if record is not None else 0.0  # a restart does not end a cool-down
            record = _Record(heartbeat.started_at_ms, heartbeat.failed_steps, until=until)
            self._nodes[heartbeat.node_id] = record
            return
        new = heartbeat.failed_steps - record.failed_steps
        record.failed_steps = heartbeat.failed_steps
        if new <= 0 or record.until > now:
            return
        record.failures.extend([now] * new)
        while record.failures and now - record.failures[0] > self.window_s:
            record.failures.popleft()
        if len(record.failures) >= self.threshold:
            record.until = now + self.cool_down_s
            log.warning(
                "node quarantined: its steps keep failing",
                node_id=heartbeat.node_id,
                failures=len(record.failures),
                window_s=self.window_s,
                cool_down_s=self.cool_down_s,
            )

    def excluded(self, live: Collection[str]) -> set[str]:
        """Which of the `live` node ids to leave out of plans now (never all of them)."""
        now = self.clock()
        held = set()
        for node_id in live:
            record = self._nodes.get(node_id)
            if record is None or not record.until:
                continue
            if record.until > now:
                held.add(node_id)
            else:
                record.until = 0.0
                record.failures.clear()
                log.info("node out of quarantine", node_id=node_id)
        return held if held != set(live) else set()
