"""The highest plan version this replica has seen signed, kept on its own disk across restarts.

Design. A plan's version is what every reader orders plans by: a node refuses a plan older than the
one it follows. The plan key itself cannot be trusted to say how far the versions went: anyone who
may write it (the coordinators' bus credential) can put an older signed plan back from the key's
history, and a leader that adopted it would count on from there, so its next plans would look
older than what the nodes hold and be refused as replays, for good. So each replica remembers the
highest version it has verified (published itself, or read signed from the key) in a file of its
own (`state_dir`), which the bus cannot reach; the leader never adopts a record below it and
numbers its next plan above it. Every replica, leader or not, follows the key and raises its mark
to each signed plan that appears, so a standby that takes over knows how far its predecessor
went. The file holds one integer and is replaced atomically (written beside it, flushed,
renamed), so a crash leaves the old value or the new one. A file that does not hold a version in
bounds is reported and counted from 0: the key's signed history still bounds the versions from
below.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import structlog
from nats.errors import Error as NatsError
from nats.js.kv import KeyValue

from mohawk_common.bus import names
from mohawk_common.bus.control_records import RecordVerifier
from mohawk_common.bus.plan_follower import MAX_PLAN_VERSION, verified_plan
from mohawk_pqc.errors import AuthenticationError

log = structlog.get_logger("mohawk.coordinator")

FILE_NAME = "plan-high-water"


class PlanHighWater:
    def __init__(self, state_dir: Path | None) -> None:
        """`state_dir`: where the value is kept; None keeps it in memory only (tests, tools)."""
        self.path = state_dir / FILE_NAME if state_dir is not None else None
        self.value = self._load()

    def raise_to(self, version: int) -> None:
        """Remember `version` if it is higher than what is remembered."""
        if version <= self.value or version > MAX_PLAN_VERSION:
            return
        self.value = version
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{FILE_NAME}.{os.getpid()}")
        with open(temporary, "w") as out:
            out.write(f"{version}\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)

    async def follow(
        self, kv: KeyValue, verifier: RecordVerifier, retry_s: float, written: Callable[[int], None]
    ) -> None:
        """Raise the mark to every plan a coordinator signed that appears in the plan key `kv`,
        leader or not, so a replica that takes over knows how far the versions went even when the
        key holds an older record by then; `written(revision)` hears of every write, deletions
        included (runs until cancelled)."""
        while True:
            try:
                watcher = await kv.watch(names.PLAN_KEY)
                async for entry in watcher:
                    if entry is None:  # the initial values are delivered
                        continue
                    written(entry.revision or 0)
                    with contextlib.suppress(AuthenticationError):  # the leader counts what it rejects
                        self.raise_to(verified_plan(entry.value or b"", verifier).version)
            except (NatsError, TimeoutError) as exc:
                log.info("plan key watch ended; watching again", error=repr(exc))
            await asyncio.sleep(retry_s)

    def _load(self) -> int:
        if self.path is None:
            return 0
        with contextlib.suppress(FileNotFoundError):
            text = self.path.read_text().strip()
            try:
                value = int(text)
            except ValueError:
                value = -1
            if 0 <= value <= MAX_PLAN_VERSION:
                return value
            log.warning("plan high-water file holds no version; counting from 0", path=str(self.path))
        return 0
