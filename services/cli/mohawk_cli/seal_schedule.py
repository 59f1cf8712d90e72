"""Request-sealing keys rotated on a schedule, not only on revocation.

Design. A model's sealing key opens every request sealed to it while it is current, so a key
copied off a node opens that node's model's requests until the key is replaced. Revocation
replaces it at once (`pki_publish.revoke_and_publish`); this replaces it every `every_days`
(default `DEFAULT_SEAL_ROTATION_DAYS`) as well, so a copy that nobody noticed goes stale too.
Rotating needs the root key: `mohawk up` (whose development root is on disk) polls a
`SealSchedule` from its loop; an operator whose root is kept offline runs
`mohawk pki rotate-seal --due` from cron or a timer where the root is, which rotates only the
models whose key is due. Nothing here waits: `poll(now)` checks at most every `check_every_s`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from mohawk_cli.pki_publish import rotate_and_publish
from mohawk_common.bus.setup import BusLimits
from mohawk_pqc.errors import PkiError
from mohawk_pqc.pki_files import seal_models_due

DEFAULT_SEAL_ROTATION_DAYS = 7.0
CHECK_EVERY_S = 60.0


@dataclass
class SealSchedule:
    """Rotates each model's sealing key under `pki` once it is `every_days` old, publishing the new
    key's record on `servers` as the NATS user of `creds` (the admin's)."""

    pki: Path
    servers: list[str]
    every_days: float = DEFAULT_SEAL_ROTATION_DAYS
    creds: Path | None = None
    tls_ca: Path | None = None
    check_every_s: float = CHECK_EVERY_S
    _next_check: float = 0.0

    def poll(self, now: float, wall_clock: float | None = None) -> list[str]:
        """Rotate what is due (checked at most every `check_every_s` of `now`, a monotonic clock;
        `wall_clock` the unix time keys are aged by, default the clock's); what was done, as log
        lines. A failure is said and retried at the next check."""
        if now < self._next_check:
            return []
        self._next_check = now + self.check_every_s
        due = seal_models_due(self.pki, self.every_days, wall_clock)
        if not due:
            return []
        try:  # every model's key rotated and published, or an error
            asyncio.run(
                rotate_and_publish(
                    self.pki, due, self.servers, BusLimits(), creds=self.creds, tls_ca=self.tls_ca
                )
            )
        except (ConnectionError, OSError, PkiError) as exc:
            return [f"sealing keys of {', '.join(due)} are due for rotation, which failed: {exc}"]
        return [f"sealing key of {model} rotated (every {self.every_days:g} days)" for model in due]
