"""Shard nodes on one host share its cores: every core while the others idle, a share while they compute.

Design. A lone request crosses the stages of a pipeline one after another, so on a host that runs
several stages (`mohawk up --nodes 2` on one machine) only one node computes at a time; with a
fixed share of the cores each (cores / nodes), a lone request runs on half the machine. Under load
the stages compute at once, and two nodes that each take every core halve each other's speed
(OpenMP's threads wait for their slowest at every barrier). So each node takes a turn's thread
count from what the others do. The nodes share a small file (`mohawk up` puts it in its data dir),
mapped by each: a slot per node, holding its pid, whether it is computing and how many turns it
has started. A node's turn (each task on its compute thread) marks it busy; when the turn ends, it
counts the other nodes that computed during it: busy when it began, busy now, or having started a
turn since (a slot whose process is gone does not count). A node that finds none busy as a turn
begins and whose last `MEMORY` turns met no other takes all its threads; otherwise its share,
`threads // (1 + most it met or finds)`. So a loaded
pipeline stays on shares (stages overlap most of the time, though not at every turn's start),
and a lone request, whose stages never overlap, keeps every core. Idle OpenMP threads should give
their core back soon (`mohawk up` sets `GOMP_SPINCOUNT` for this): OpenMP's default spin keeps a
finished node's threads on the cores the next stage is about to use.
A slot is claimed under a lock on the file (the first slot free or whose pid is gone: a node
that stops leaves its slot to the next); reading and writing slots take no lock (each node writes
only its own).

A node's measured speed (`capacity.py`, what the planner splits the layers by) is taken with the
host's cores to itself (`undisturbed`): two nodes of `mohawk up` load at once and then measure at
once, and a dozen sub-millisecond steps timed while the other node's threads also held both cores
came out many times slower, so the bundled model was split 28 layers to 2 in two of four starts
(a pipeline no faster than its 28-layer stage). Measurements take turns under a lock on the file,
each begins once no other node is computing (waiting at most `WAIT_S` in all) and is taken again
while another node computed during it (at most `TRIES` times; the fastest is kept).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

SLOTS = 64
SLOT = struct.Struct("<qqq")  # pid, busy, turns started
MEMORY = 4  # turns a node remembers meeting other nodes in
WAIT_S = 30.0  # how long a measurement waits for the other nodes to stop computing
TRIES = 5  # measurements taken while another node computed, before the fastest is kept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _computed(before: tuple[int, int] | None, after: tuple[int, int]) -> bool:
    """Whether a node computed during a turn, from its (busy, turns) when it began and ended."""
    return bool(after[0]) or (before is not None and (bool(before[0]) or before[1] != after[1]))


class HostCores:
    def __init__(self, path: Path, threads: int, set_threads: Callable[[int], None]) -> None:
        """`threads`: this node's most; `set_threads`: applies a turn's count (torch's)."""
        self.threads, self._set_threads = threads, set_threads
        self._pid = os.getpid()
        self._met: deque[int] = deque(maxlen=MEMORY)
        self._turns = 0
        self._current = 0
        self._file = open(path, "a+b")  # noqa: SIM115  (held: measurements lock it, `undisturbed`)
        with self._locked():
            if os.fstat(self._file.fileno()).st_size < SLOTS * SLOT.size:
                self._file.truncate(SLOTS * SLOT.size)
            self._map = mmap.mmap(self._file.fileno(), SLOTS * SLOT.size)
            self._slot = self._claim()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.lockf(self._file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self._file, fcntl.LOCK_UN)

    def _claim(self) -> int:
        for slot in range(SLOTS):
            pid = SLOT.unpack_from(self._map, slot * SLOT.size)[0]
            if pid in (0, self._pid) or not _alive(pid):
                SLOT.pack_into(self._map, slot * SLOT.size, self._pid, 0, 0)
                return slot
        raise RuntimeError(f"more than {SLOTS} nodes share this host's cores file")

    def _others(self) -> dict[int, tuple[int, int]]:
        """Every other live node's slot: (busy, turns started)."""
        slots = SLOT.iter_unpack(self._map[:])
        return {
            slot: (busy, turns)
            for slot, (pid, busy, turns) in enumerate(slots)
            if pid and pid != self._pid and _alive(pid)
        }

    def _mark(self, busy: bool) -> None:
        SLOT.pack_into(self._map, self._slot * SLOT.size, self._pid, int(busy), self._turns)

    def threads_now(self, busy_now: int = 0) -> int:
        """A turn's thread count, `busy_now` other nodes computing as it begins."""
        return max(1, self.threads // (1 + max((busy_now, *self._met))))

    @contextlib.contextmanager
    def turn(self) -> Iterator[int]:
        """A task on the compute thread: marks this node busy and sets its threads for the task
        (yielded)."""
        self._turns += 1
        self._mark(True)
        before = self._others()
        threads = self.threads_now(sum(busy for busy, _ in before.values()))
        if threads != self._current:
            self._set_threads(threads)
            self._current = threads
        try:
            yield threads
        finally:
            after = self._others()
            self._mark(False)
            self._met.append(sum(1 for slot, now in after.items() if _computed(before.get(slot), now)))

    def forget(self) -> None:
        """Forget the turns met so far: a stage just loaded (a re-plan) runs a new pattern. A
        failover's catch-up is one step through the stages one after another, so each node meets
        none and takes every thread, where the turns of the pipeline before (stages computing at
        once) would have kept it to its share."""
        self._met.clear()

    def undisturbed(self, measure: Callable[[], float]) -> float:
        """`measure()` (a timing, run inside this node's turn on every one of its threads) with the
        host's cores to itself, as far as the other nodes allow (module docstring)."""
        self._mark(False)  # not computing while it waits: a node measuring now must not wait for it
        with self._locked():
            self._mark(True)
            if self._current != self.threads:
                self._set_threads(self.threads)
                self._current = self.threads
            fastest, deadline = float("inf"), time.monotonic() + WAIT_S  # for all tries together
            for _ in range(TRIES):
                while any(busy for busy, _ in self._others().values()) and time.monotonic() < deadline:
                    time.sleep(0.01)
                before = self._others()
                fastest = min(fastest, measure())
                after = self._others()
                if not any(_computed(before.get(slot), now) for slot, now in after.items()):
                    break
            return fastest
