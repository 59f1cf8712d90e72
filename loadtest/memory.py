"""Resident memory of the cluster's processes: a sampler every 0.5 s for the peak, and snapshots.

Design. A thread (not the event loop, which is busiest exactly when memory is) reads each process's
RSS with psutil every `interval_s` and keeps the peak; a process that has exited is left out from
then on. `snapshot` reads every process once: the run takes one after the warm-up and one after the
settle, and `compare` says, process by process, whether the second is within a tolerance of the
first.
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
        self.num_samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, rss in snapshot(self.pids).items():
                self.peak[name] = max(rss, self.peak.get(name, 0))
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

    @property
    def change(self) -> float | None:
        """(after - before) / before; None when either is missing."""
        if not self.before_bytes or self.after_bytes is None:
            return None
        return (self.after_bytes - self.before_bytes) / self.before_bytes

    @property
    def within(self) -> bool | None:
        change = self.change
        return None if change is None else abs(change) <= self.tolerance


def compare(
    before: Mapping[str, int], peak: Mapping[str, int], after: Mapping[str, int], tolerance: float = 0.10
) -> list[MemoryRow]:
    names = list(dict.fromkeys([*before, *peak, *after]))
    return [MemoryRow(n, before.get(n), peak.get(n), after.get(n), tolerance) for n in names]
