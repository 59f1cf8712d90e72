"""Which gateway processes are gone: their presence keys in KV `mohawk_gateways` have lapsed.

Each gateway refreshes its own key every second (TTL 4 s, `BusLimits.gateway_ttl_s`), and every
request names the gateway process that waits for its tokens. Stage 0 asks here, every
`ORPHAN_CHECK_S`, about the gateways of the requests it runs; a gateway counts as gone once its key
has been missing at every check for `GRACE_S`, so a gateway that is only reconnecting after a NATS
restart (whose keys may have expired while the server was down) gets time to write its key again.
A check that cannot reach the bucket says nothing and resets no clock. The bound from a gateway's
death to its requests' cancellation is TTL + grace + one check: 4 + 3 + 1 = 8 s.

A key's value is a `GatewayPresence` record signed by the gateway's certificate. Where the node
verifies control records, a value that is unsigned, signed by another gateway or for another key,
or older than `MAX_PRESENCE_AGE_S` counts as missing and is counted as a rejection: a bus client
that may write the bucket cannot keep a dead gateway's requests alive by replaying its last value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from nats.js import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError
from nats.js.kv import KeyValue

from mohawk_common.bus import names
from mohawk_common.bus.control import decode_json
from mohawk_common.bus.control_records import RecordVerifier
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2

ORPHAN_CHECK_S = 1.0
GRACE_S = 3.0
MAX_PRESENCE_AGE_S = 15.0  # a refresh every TTL/4 = 1 s, plus clock skew between hosts

Reject = Callable[[AuthenticationError], None]


def check_presence(
    value: bytes, key: str, verifier: RecordVerifier, *, now: float | None = None
) -> bus_pb2.GatewayPresence:
    """The presence record stored under `key`, if it is signed by its gateway and fresh; else
    AuthenticationError. A verifier with no trust store accepts any value (an insecure cluster)."""
    if not verifier.enforcing:
        return bus_pb2.GatewayPresence(instance=key)
    try:
        record = decode_json(bus_pb2.GatewayPresence, value)
    except Exception as exc:
        raise AuthenticationError("malformed", f"gateway presence {key!r}") from exc
    verifier.verify(record, "presence")
    if record.instance != key:
        raise AuthenticationError("tampered", f"presence of {record.instance!r} stored under {key!r}")
    age_s = (time.time() if now is None else now) - record.at_ms / 1000
    if abs(age_s) > MAX_PRESENCE_AGE_S:
        raise AuthenticationError("stale", f"presence of {key!r} written {age_s:.0f} s ago")
    return record


class GatewayPresence:
    def __init__(
        self,
        js: JetStreamContext,
        grace_s: float = GRACE_S,
        *,
        verifier: RecordVerifier | None = None,
        reject: Reject | None = None,
    ) -> None:
        self.js = js
        self.grace_s = grace_s
        self.verifier = verifier or RecordVerifier(None)
        self._reject = reject
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
                    entry = await kv.get(gateway)
                    check_presence(entry.value or b"", gateway, self.verifier)
                    self._missing_since.pop(gateway, None)
                except (KeyNotFoundError, KeyDeletedError):
                    self._missing_since.setdefault(gateway, now)
                except AuthenticationError as exc:
                    if self._reject is not None:
                        self._reject(exc)
                    self._missing_since.setdefault(gateway, now)
        except Exception:  # the bus is away: no verdict this time
            return set()
        return {g for g, since in self._missing_since.items() if now - since >= self.grace_s}
