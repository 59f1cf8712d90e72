"""Nodes on one host share its cores: all of them while the others idle, a share while they compute;
a node measures its speed with the cores to itself.

The other nodes are real processes mapping the same file (a slot is a process's)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mohawk_shard.node import host_cores
from mohawk_shard.node.host_cores import MEMORY, SLOT, HostCores

# a node in another process: one turn at a time, driven line by line on stdin
OTHER = """
import sys
from pathlib import Path
from mohawk_shard.node.host_cores import HostCores
cores = HostCores(Path(sys.argv[1]), 1, lambda n: None)
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "turn":
        with cores.turn():
            print("busy", flush=True)
            sys.stdin.readline()
        print("idle", flush=True)
    elif line.strip() == "measure":
        with cores.turn():
            cores.undisturbed(lambda: (print("measuring", flush=True), sys.stdin.readline(), 1.0)[2])
        print("measured", flush=True)
    elif line.strip() == "vanish":
        import os
        with cores.turn():
            print("busy", flush=True)
            os._exit(0)  # killed mid-turn: its slot still says busy
"""


class Other:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OTHER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.expect("ready")

    def expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == word

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def begin(self) -> None:
        self.send("turn")
        self.expect("busy")

    def end(self) -> None:
        self.send("")
        self.expect("idle")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def share(tmp_path: Path) -> Iterator[tuple[Path, list[int]]]:
    applied: list[int] = []
    yield tmp_path / "host-cores", applied


@pytest.fixture
def two_nodes(share: tuple[Path, list[int]]) -> Iterator[tuple[HostCores, list[int], Other]]:
    """This node (two threads; `applied`: the counts it set) and another process on the same file."""
    path, applied = share
    other = Other(path)
    try:
        yield HostCores(path, 2, applied.append), applied, other
    finally:
        other.close()


def turn(cores: HostCores) -> int:
    with cores.turn() as threads:
        return threads


def test_a_lone_node_takes_every_core_and_a_loaded_one_its_share(share: tuple[Path, list[int]]) -> None:
    path, applied = share
    cores = HostCores(path, 4, applied.append)
    assert turn(cores) == 4 and applied == [4]
    other = Other(path)
    try:
        other.begin()  # another node computes while this one does
        assert turn(cores) == 2  # busy as the turn begins
        assert turn(cores) == 2 and applied == [4, 2]
        other.end()
        for _ in range(MEMORY):  # still remembered
            assert turn(cores) == 2
        assert turn(cores) == 4 and applied == [4, 2, 4]  # not met for MEMORY turns
    finally:
        other.close()


def test_a_stage_just_loaded_forgets_the_turns_met_before(
    two_nodes: tuple[HostCores, list[int], Other],
) -> None:
    """A failover's catch-up runs through the stages one after another: a node that loaded a stage
    takes every thread for it, whatever the pipeline before it overlapped with."""
    cores, _, other = two_nodes
    other.begin()
    assert turn(cores) == 1
    other.end()
    assert turn(cores) == 1  # remembered
    cores.forget()  # a stage loaded
    assert turn(cores) == 2


def test_a_turn_another_node_began_and_ended_within_counts(
    two_nodes: tuple[HostCores, list[int], Other],
) -> None:
    """Stages overlap without either seeing the other busy at its own turn's ends."""
    cores, _, other = two_nodes
    with cores.turn() as threads:
        assert threads == 2
        other.begin()
        other.end()
    assert turn(cores) == 1


def test_a_node_that_died_mid_turn_does_not_hold_cores_and_its_slot_is_taken_again(
    share: tuple[Path, list[int]],
) -> None:
    path, applied = share
    cores = HostCores(path, 2, applied.append)
    other = Other(path)
    other.send("vanish")
    other.expect("busy")
    other.proc.wait(10)
    assert turn(cores) == 2 and turn(cores) == 2
    again = Other(path)  # the dead process's slot is free again
    try:
        pids = [pid for pid, _, _ in SLOT.iter_unpack(path.read_bytes())]
        assert pids[:3] == [os.getpid(), again.proc.pid, 0]
    finally:
        again.close()


def test_a_share_is_never_below_one_thread(share: tuple[Path, list[int]]) -> None:
    path, applied = share
    cores = HostCores(path, 1, applied.append)
    others = [Other(path) for _ in range(2)]
    try:
        for other in others:
            other.begin()
        assert turn(cores) == 1 and turn(cores) == 1
    finally:
        for other in others:
            other.close()


def measure_in_background(
    cores: HostCores, measure: Callable[[], float]
) -> tuple[threading.Thread, list[float]]:
    result: list[float] = []

    def run() -> None:
        with cores.turn():
            result.append(cores.undisturbed(measure))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_a_measurement_waits_for_the_other_nodes_to_stop_computing(
    two_nodes: tuple[HostCores, list[int], Other],
) -> None:
    cores, applied, other = two_nodes
    other.begin()
    thread, result = measure_in_background(cores, lambda: 0.5)
    time.sleep(0.3)
    assert not result  # still waiting: the other node computes
    other.end()
    thread.join(10)
    assert result == [0.5]
    assert applied == [1, 2]  # its turn began on a share; it measured on every one of its threads


def test_a_measurement_another_node_computed_during_is_taken_again(
    two_nodes: tuple[HostCores, list[int], Other],
) -> None:
    cores, _, other = two_nodes
    timings = iter([5.0, 1.0, 3.0])
    calls = []

    def measure() -> float:
        calls.append(1)
        if len(calls) == 1:  # the other node takes a turn in the middle of the first measurement
            other.begin()
            other.end()
        return next(timings)

    with cores.turn():
        assert cores.undisturbed(measure) == 1.0
    assert len(calls) == 2  # the second was undisturbed: no third

    def always_disturbed() -> float:
        other.begin()
        other.end()
        return 2.0

    with cores.turn():
        assert cores.undisturbed(always_disturbed) == 2.0  # the fastest of TRIES


def test_two_nodes_never_measure_at_once(
    two_nodes: tuple[HostCores, list[int], Other], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_cores, "WAIT_S", 0.2)
    cores, _, other = two_nodes
    other.send("measure")
    other.expect("measuring")
    thread, result = measure_in_background(cores, lambda: 0.5)
    time.sleep(0.5)
    assert not result  # the other node holds the measurement lock
    # this node began a turn during the other's measurement, so that one may be taken again
    assert other.proc.stdout is not None
    for _ in range(host_cores.TRIES):
        other.send("")
        if other.proc.stdout.readline().strip() == "measured":
            break
    else:
        pytest.fail("the other node never finished measuring")
    thread.join(10)
    assert result == [0.5]


def test_a_node_that_never_stops_computing_holds_a_measurement_up_wait_s_in_all(
    two_nodes: tuple[HostCores, list[int], Other], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_cores, "WAIT_S", 0.3)
    cores, _, other = two_nodes
    other.begin()  # busy through every try
    calls = []
    started = time.monotonic()
    with cores.turn():
        assert cores.undisturbed(lambda: calls.append(1) or 1.0) == 1.0
    assert len(calls) == host_cores.TRIES  # each disturbed, so each taken again
    assert time.monotonic() - started < 3 * host_cores.WAIT_S  # not WAIT_S a try (1.5 s)
