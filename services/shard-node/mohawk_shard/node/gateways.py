"""Which gateway processes are gone: their presence keys in KV `mohawk_gateways` have lapsed.

Each gateway refreshes its own key every second (TTL 4 s, `BusLimits.gateway_ttl_s`), and every
request names the gateway process that waits for its tokens. Stage 0 asks here, every
`ORPHAN_CHECK_S`, about the gateways of the requests it runs; a gateway counts as gone once its key
has been missing at every check for `GRACE_S`, so a gateway that is only reconnecting after a NATS
restart (whose keys may have expired while the server was down) gets time to write its key again.
A check that cannot reach the bucket says nothing and resets no clock. The bound from a gateway's
death to its requests' cancellation is TTL + grace + one check: 4 + 3 + 1 = 8 s.
"""

from __future__ import annotations

from collections.abc import Iterable

from nats.js import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError
from nats.js.kv import KeyValue

from mohawk_common.bus import names

ORPHAN_CHECK_S = 1.0
GRACE_S = 3.0


class GatewayPresence:
    def __init__(self, js: JetStreamContext, grace_s: float = GRACE_S) -> None:
        self.js = js
        self.grace_s = grace_s
        self._kv: KeyValue | None = None
        self._missing_since: dict[str, float] = {}

    async def gone(self, gateways: Iterable[str], now: float) -> set[str]:
        """Those of `gateways` whose key has been missing at every check for `grace_s` (`now`:
        monotonic seconds)."""
        wanted = set(gateways)
        self._missing_since = {g: t for g, t in self._missing_since.items() if g in wanted}
        try:
            kv = self._kv or await self.js.key_value(names.GATEWAYS_BUCKET)
            self._kv = kv
            for gateway in wanted:
                try:
                    await kv.get(gateway)
                    self._missing_since.pop(gateway, None)
                except (KeyNotFoundError, KeyDeletedError):
                    self._missing_since.setdefault(gateway, now)
        except Exception:  # the bus is away: no verdict this time
            return set()
        return {g for g, since in self._missing_since.items() if now - since >= self.grace_s}
