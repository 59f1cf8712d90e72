"""Latency of the hops into a stage: publish time (in the frame header) to the frame's arrival here.

Sender and receiver read the wall clock, so across hosts the figure includes their clock offset;
on one host (and with NTP, roughly across hosts) it is the time a hop adds. Nodes report the
median and p99 of their last frames in heartbeats.
"""

from __future__ import annotations

import time
from collections import deque

_WINDOW = 1000


class HopStats:
    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=_WINDOW)
        self.num_hops = 0

    def record(self, sent_at: float, arrived_at: float | None = None) -> float | None:
        """One hop; `arrived_at` (default: now) is when its last message reached this process.
        Returns the hop's seconds (None when the frame carried no send time)."""
        if sent_at <= 0:
            return None
        hop_s = max(0.0, (arrived_at or time.time()) - sent_at)
        self._recent.append(hop_s)
        self.num_hops += 1
        return hop_s

    def percentile_ms(self, q: float) -> float:
        if not self._recent:
            return 0.0
        ordered = sorted(self._recent)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000
