"""Keeping a local cluster's children alive: a crashed child is started again, with backoff and a limit.

Design. `mohawk up` owns nats-server, the coordinators, the shard nodes and the gateway as child
processes. A child that exits while the cluster is not stopping is restarted after a backoff that
doubles with each restart of that child (1 s, 2 s, 4 s … capped at `max_backoff_s`) and falls back
to the base once the child has stayed up for `stable_s`. More than `max_restarts` restarts of one
child within `window_s` means it crashes for a reason a restart will not fix: it is left down and
said so, once; the rest of the cluster keeps serving (a gateway left down is the one thing that
makes the cluster useless, and `mohawk up` says that too, but still does not stop the others).
Nothing here waits: `poll(now)` is called from `mohawk up`'s loop and returns what it did, as log
lines, so the loop decides how to print them and the tests drive it with their own clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class Supervised(Protocol):
    def exited(self) -> dict[str, int]: ...

    def respawn(self, name: str) -> None: ...


@dataclass
class _ChildState:
    restarts: deque[float] = field(default_factory=deque)  # when each restart within the window was
    backoff_s: float = 0.0
    restart_at: float | None = None
    started_at: float = 0.0
    given_up: bool = False


@dataclass
class SupervisorPolicy:
    base_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_restarts: int = 5
    window_s: float = 300.0
    stable_s: float = 60.0


class Supervisor:
    def __init__(self, cluster: Supervised, policy: SupervisorPolicy | None = None) -> None:
        self.cluster = cluster
        self.policy = policy or SupervisorPolicy()
        self._children: dict[str, _ChildState] = {}
        self.num_restarts = 0

    def poll(self, now: float, on_event: Callable[[str], None] | None = None) -> list[str]:
        """Schedule a restart for each newly exited child and restart those whose backoff is over."""
        events: list[str] = []
        exited = self.cluster.exited()
        for name, code in exited.items():
            state = self._children.setdefault(name, _ChildState())
            if state.given_up or state.restart_at is not None:
                continue
            policy = self.policy
            while state.restarts and now - state.restarts[0] > policy.window_s:
                state.restarts.popleft()
            if len(state.restarts) >= policy.max_restarts:
                state.given_up = True
                events.append(
                    f"{name} exited (code {code}) {policy.max_restarts + 1} times within "
                    f"{policy.window_s:.0f} s: left down; see its log"
                )
                continue
            stable = state.started_at > 0 and now - state.started_at >= policy.stable_s
            previous = 0.0 if stable else state.backoff_s
            state.backoff_s = min(policy.max_backoff_s, previous * 2 or policy.base_backoff_s)
            state.restart_at = now + state.backoff_s
            events.append(f"{name} exited (code {code}): restarting in {state.backoff_s:.0f} s")
        for name, state in self._children.items():
            if state.restart_at is None or now < state.restart_at:
                continue
            state.restart_at = None
            if name not in exited:
                continue  # came back by itself (or someone restarted it)
            try:
                self.cluster.respawn(name)
            except Exception as exc:  # the next poll sees it down again and backs off further
                events.append(f"{name} could not be restarted: {exc}")
                continue
            state.restarts.append(now)
            state.started_at = now
            self.num_restarts += 1
            events.append(
                f"{name} restarted (restart {len(state.restarts)} within {self.policy.window_s:.0f} s)"
            )
        if on_event is not None:
            for event in events:
                on_event(event)
        return events

    def given_up(self) -> list[str]:
        return [name for name, state in self._children.items() if state.given_up]
