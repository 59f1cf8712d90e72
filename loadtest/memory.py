"""Resident memory of the cluster's processes: a sampler every 0.5 s for the peak and the working
set, and snapshots.

Design. A thread (not the event loop, which is busiest exactly when memory is) reads each process's
RSS with psutil every `interval_s`, keeps the peak, and keeps one reading, the working set, from
the moment `mark_working_set()` is called (the run calls it once a quarter of its requests have
ended: by then every client is in and every buffer the load needs has been allocated); a process
that has exited is left out from then on. `snapshot` reads every process once: the run takes one
after the warm-up and one after the settle. `compare` says, process by process, whether the one
after the run is within a tolerance of the working set: a leak grows with every request served,
so it shows from there to the end, while memory the load's concurrency needed (1,050 connections
where the warm-up had 20) is reached early and then stays flat, and allocators keep it for the next
load rather than giving it back. The change from before the load is reported beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType

import psutil

SAMPLE_INTERVAL_S = 0.5
MIB = 1024 * 1024


def snapshot(pids: Mapping[str, int]) -> dict[str, int]:
    """RSS in bytes of each process still running, by name."""
    rss: dict[str, int] = {}
    for name, pid in pids.items():
        try:
            rss[name] = int(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            continue
    return rss


class PeakSampler:
    """`with PeakSampler(pids) as sampler:` ... `sampler.peak` (bytes, by name)."""

    def __init__(self, pids: Mapping[str, int], interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.pids = dict(pids)
        self.interval_s = interval_s
        self.peak: dict[str, int] = {}
        self.working_set: dict[str, int] = {}
        self.num_samples = 0
        self._mark = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def mark_working_set(self) -> None:
        """Keep the next reading as the working set (once)."""
        self._mark.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            readings = snapshot(self.pids)
            for name, rss in readings.items():
                self.peak[name] = max(rss, self.peak.get(name, 0))
            if self._mark.is_set() and not self.working_set:
                self.working_set = readings
            self.num_samples += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class MemoryRow:
    name: str
    before_bytes: int | None
    peak_bytes: int | None
    after_bytes: int | None
    tolerance: float
    working_bytes: int | None = None

    @property
    def change(self) -> float | None:
        """(after - before) / before; None when either is missing."""
        return _change(self.before_bytes, self.after_bytes)

    @property
    def growth(self) -> float | None:
        """(after - working set) / working set: what the run added once its load was in."""
        return _change(self.working_bytes, self.after_bytes)

    @property
    def within(self) -> bool | None:
        growth = self.growth
        return None if growth is None else abs(growth) <= self.tolerance


def _change(start: int | None, end: int | None) -> float | None:
    return None if not start or end is None else (end - start) / start


def compare(
    before: Mapping[str, int],
    peak: Mapping[str, int],
    after: Mapping[str, int],
    tolerance: float = 0.10,
    working_set: Mapping[str, int] | None = None,
) -> list[MemoryRow]:
    working = working_set or {}
    names = list(dict.fromkeys([*before, *peak, *after]))
    return [MemoryRow(n, before.get(n), peak.get(n), after.get(n), tolerance, working.get(n)) for n in names]
