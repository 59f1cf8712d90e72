"""A node that leaves the bus, known from nats-server itself: its connection's disconnect advisory.

Design. Heartbeats find a dead node only after `node_ttl_s` of silence (3 s by default). nats-server
knows sooner: when a client's connection closes (the process exited or was killed, its socket
reset) the server announces it at once in the system account (`$SYS.ACCOUNT.<account>.DISCONNECT`,
`io.nats.server.advisory.v1.client_disconnect`; measured 3-4 ms after a SIGKILL on loopback), and
in a cluster every server passes it on. A coordinator given the events user (`nats_auth`: a system
account user that may only subscribe to the MOHAWK account's connect and disconnect advisories)
hears them on a connection of its own. The advisory names the client's user JWT, signed by the
account, whose `name` is the process id its certificate was issued for: a node cannot be made to
"leave" by another client naming its connection after it, and only servers publish there.

`DepartureWatch` turns advisories into departures. A node's connection that closes and comes back
within `grace_s` (a client reconnecting after a server dropped it) is no departure; one whose
server shuts down (`Server Shutdown`: it reconnects to another, or heartbeats decide) is none
either. Any other close leaves the node without a connection, and after `grace_s` it is gone:
the coordinator drops it from the registry and re-plans at once (a departure does not wait for
the live set to settle, as a join does). A link that flaps therefore re-plans once for the drop,
and once more only after the node has been back for `plan_settle_s`. How soon a live client comes
back sets the grace (0.05 s by default, 20 times that): nats-py moves to the next server of its
pool at once, 2-3 ms after a reset on loopback (a scratch script cutting a client's TCP connection
through a proxy, 10 cuts), but waits `reconnect_time_wait` (1 s, `bus/connect.py`) before it tries a server it
tried within that time, so a node with one server is gone after any cut, however short the grace.

What each signal sees of a network partition: a host cut off from its NATS server keeps its TCP
connection open on the server's side until the server's pings go unanswered (2 minutes by
default: `Stale Connection`), so the advisory is late and heartbeats (`node_ttl_s`) find it; a
NATS server cut off from the others takes its clients' advisories with it, and the coordinators
on the other side again see only the heartbeats stop. Advisories make a crash fast to see; the
heartbeat timeout stays for hangs and partitions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

from mohawk_common.bus.connect import connect
from mohawk_common.bus.nats_jwt import creds_subscriptions, decode_claims
from mohawk_coordinator.config import CoordinatorSettings

log = structlog.get_logger("mohawk.coordinator.departures")

CONNECT = "io.nats.server.advisory.v1.client_connect"
DISCONNECT = "io.nats.server.advisory.v1.client_disconnect"
NOT_A_DEPARTURE = frozenset({"Server Shutdown"})  # the client reconnects elsewhere


@dataclass(frozen=True, slots=True)
class Advisory:
    """One connect or disconnect of a client, as a server announced it."""

    kind: str  # CONNECT or DISCONNECT
    user: str  # the name in the client's user JWT: the process id
    connection: tuple[str, int]  # (server id, client id): one connection, cluster-wide
    reason: str = ""


def parse_advisory(data: bytes) -> Advisory | None:
    """The advisory in `data`, or None for anything else (another type, a client without a user
    JWT, a leaf or route connection, a malformed message)."""
    try:
        event: dict[str, Any] = json.loads(data)
        kind = event["type"]
        client, server = event["client"], event["server"]
        if kind not in (CONNECT, DISCONNECT) or client.get("kind", "Client") != "Client":
            return None
        user = str(decode_claims(client["jwt"])["name"])
        connection = (str(server["id"]), int(client["id"]))
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return Advisory(kind, user, connection, str(event.get("reason", "")))


class DepartureWatch:
    """Which users' processes left the bus: every connection of theirs closed, none back within
    `grace_s` (on the caller's clock)."""

    def __init__(self, grace_s: float, clock: Callable[[], float]) -> None:
        self.grace_s = grace_s
        self._clock = clock
        self._open: dict[str, set[tuple[str, int]]] = {}  # user -> connections seen opening
        self._closed_at: dict[str, tuple[float, str]] = {}  # user -> (when its last one closed, why)

    def observe(self, advisory: Advisory) -> None:
        connections = self._open.setdefault(advisory.user, set())
        if advisory.kind == CONNECT:
            connections.add(advisory.connection)
            self._closed_at.pop(advisory.user, None)
            return
        connections.discard(advisory.connection)
        if advisory.reason in NOT_A_DEPARTURE or connections:
            return
        del self._open[advisory.user]
        self._closed_at[advisory.user] = (self._clock(), advisory.reason)

    def due(self) -> list[tuple[str, str]]:
        """The users gone for `grace_s` now, with the reason their last connection closed; each
        is reported once."""
        now = self._clock()
        gone = [(user, why) for user, (at, why) in self._closed_at.items() if now - at >= self.grace_s]
        for user, _ in gone:
            del self._closed_at[user]
        return gone


async def hear_advisories(settings: CoordinatorSettings, heard: Callable[[Advisory], None]) -> Client | None:
    """Connect as the events user (`settings.events_creds`) and pass every connection advisory its
    JWT lets it hear to `heard`; the connection (close it to stop), or None without the user."""
    creds = settings.events_creds
    if creds is None:
        return None
    nc = await connect(
        settings.nats_servers,
        name=f"coordinator-{settings.coordinator_id}-events",
        creds=creds,
        tls_ca=settings.nats_tls_ca,
    )

    async def on_message(msg: Msg) -> None:
        advisory = parse_advisory(msg.data)
        if advisory is not None:
            heard(advisory)

    subjects = creds_subscriptions(creds.read_text())
    for subject in subjects:
        await nc.subscribe(subject, cb=on_message)
    log.info("hearing the servers' connection advisories", subjects=subjects)
    return nc
