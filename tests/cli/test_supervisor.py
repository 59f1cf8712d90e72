"""The supervisor's policy on its own clock: backoff doubles, calms down once stable, gives up at the limit.

(`tests/cli/test_up.py` kills real children of `mohawk up` and sees them come back.)"""

from __future__ import annotations

from mohawk_cli.supervisor import Supervisor, SupervisorPolicy


class Children:
    """Which children are down; `respawn` brings one up (the real one is `LocalCluster`)."""

    def __init__(self) -> None:
        self.down: dict[str, int] = {}
        self.respawned: list[str] = []

    def exited(self) -> dict[str, int]:
        return dict(self.down)

    def respawn(self, name: str) -> None:
        self.respawned.append(name)
        self.down.pop(name)


def test_a_crashed_child_restarts_after_a_doubling_backoff() -> None:
    children = Children()
    supervisor = Supervisor(children, SupervisorPolicy(base_backoff_s=1, max_backoff_s=8, stable_s=60))
    children.down["shard-1"] = -9
    assert supervisor.poll(0.0) == ["shard-1 exited (code -9): restarting in 1 s"]
    assert supervisor.poll(0.5) == [] and children.respawned == []
    assert supervisor.poll(1.0) == ["shard-1 restarted (restart 1 within 300 s)"]
    waits = []
    for crash_at in (2.0, 10.0, 30.0, 60.0):  # crashes soon after each start: 2, 4, 8, 8 s
        children.down["shard-1"] = 1
        event = supervisor.poll(crash_at)[0]
        waits.append(int(event.rsplit(" in ", 1)[1].split()[0]))
        supervisor.poll(crash_at + 8)
    assert waits == [2, 4, 8, 8]
    assert supervisor.num_restarts == 5


def test_a_child_that_stayed_up_starts_again_from_the_base_backoff() -> None:
    children = Children()
    supervisor = Supervisor(children, SupervisorPolicy(base_backoff_s=1, stable_s=60))
    for at in (0.0, 5.0):
        children.down["gateway"] = 1
        supervisor.poll(at)
        supervisor.poll(at + 4)
    children.down["gateway"] = 1
    assert supervisor.poll(500.0) == ["gateway exited (code 1): restarting in 1 s"]


def test_too_many_restarts_leave_the_child_down_and_the_others_running() -> None:
    children = Children()
    policy = SupervisorPolicy(base_backoff_s=1, max_backoff_s=1, max_restarts=2, window_s=100)
    supervisor = Supervisor(children, policy)
    for at in (0.0, 10.0):
        children.down["coordinator-1"] = 3
        supervisor.poll(at)
        supervisor.poll(at + 1)
    children.down["coordinator-1"] = 3
    children.down["shard-2"] = -9
    events = supervisor.poll(20.0)
    assert "coordinator-1 exited (code 3) 3 times within 100 s: left down; see its log" in events
    assert "shard-2 exited (code -9): restarting in 1 s" in events
    supervisor.poll(21.0)
    assert children.respawned.count("coordinator-1") == 2 and "shard-2" in children.respawned
    assert supervisor.given_up() == ["coordinator-1"]
    assert supervisor.poll(500.0) == []  # left down, said once


def test_restarts_older_than_the_window_are_forgotten() -> None:
    children = Children()
    supervisor = Supervisor(children, SupervisorPolicy(max_restarts=1, window_s=100, max_backoff_s=1))
    children.down["nats"] = -9
    supervisor.poll(0.0)
    supervisor.poll(1.0)
    children.down["nats"] = -9
    assert supervisor.poll(200.0) == ["nats exited (code -9): restarting in 1 s"]
