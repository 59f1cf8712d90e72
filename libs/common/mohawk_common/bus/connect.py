"""Connecting to NATS: keep trying, one clear log line per failed attempt, never a traceback loop.

A process proves who it is with its NATS user's `.creds` file (`nats_auth.issue_user`: a user JWT
scoped to that process and the seed that signs the server's nonce), passed as `creds` or else named
by MOHAWK_NATS_CREDS; its inbox is then `_INBOX.<its name>` (`nats_permissions.inbox_prefix`), which
no other process may subscribe to. URLs are logged with any password in them replaced by ***
(`redact_url`). Where the bus runs TLS (`nats_tls`), the client trusts
only the bus CA, passed as `tls_ca` or else named by MOHAWK_NATS_TLS_CA, and checks the server's
name; a server that asks for TLS is never spoken to in plaintext (nats-py upgrades, and with no
CA given it trusts only the system's CAs, which never signed the bus's certificates).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import structlog
from nats.aio.client import Client

from mohawk_common.bus.nats_jwt import creds_name
from mohawk_common.bus.nats_permissions import inbox_prefix
from mohawk_common.logging import redact_url
from mohawk_common.tasks import cancel_and_wait

log = structlog.get_logger("mohawk.bus")

CREDS_ENV = "MOHAWK_NATS_CREDS"
TLS_CA_ENV = "MOHAWK_NATS_TLS_CA"

_FIRST_RETRY_S = 0.5
_MAX_RETRY_S = 5.0
# a server cut off from us (its host's link down) is given up after about PING_INTERVAL_S ×
# (MAX_OUTSTANDING_PINGS + 1), 15 s, and the client moves to another server of the pool; nats-py's
# defaults (2 pings 120 s apart) kept a service publishing into a dead link for minutes. A
# shorter bound would also give up on live servers that a busy machine answers late.
PING_INTERVAL_S = 5
MAX_OUTSTANDING_PINGS = 2


def credential_options(creds: str | Path | None = None) -> dict[str, Any]:
    """nats-py's connect options for credential file `creds`, else MOHAWK_NATS_CREDS's, else none."""
    path = creds or os.environ.get(CREDS_ENV) or None
    if path is None or path == "null":  # "null": none, as settings read it
        return {}
    try:
        name = creds_name(Path(path).read_text())
        prefix = inbox_prefix(name)
    except (OSError, ValueError, KeyError) as exc:
        raise ConnectionError(f"cannot read the NATS credential {path}: {exc}") from exc
    return {"user_credentials": str(path), "inbox_prefix": prefix}


def tls_options(tls_ca: str | Path | None = None) -> dict[str, Any]:
    """nats-py's connect options for the bus CA `tls_ca`, else MOHAWK_NATS_TLS_CA's, else none."""
    path = tls_ca or os.environ.get(TLS_CA_ENV) or None
    if path is None:
        return {}
    # imported only where the bus runs TLS: with it imported by every shard node, the survivors of
    # a killed middle stage grew the cluster's RSS from 5.6 to 6.7 GB, past the chaos suite's bound
    # (tests/chaos/test_shard_kill.py); why that import does so is not known yet
    from mohawk_common.bus.nats_tls import client_context

    return {"tls": client_context(path)}


async def connect(
    servers: str | Sequence[str],
    *,
    name: str,
    attempts: int | None = None,
    connect_timeout: int = 2,
    creds: str | Path | None = None,
    tls_ca: str | Path | None = None,
) -> Client:
    """Connect to `servers` as the user of credential file `creds` (default: MOHAWK_NATS_CREDS's,
    else anonymous), over TLS verified against `tls_ca` (default: MOHAWK_NATS_TLS_CA's), retrying
    with backoff (forever unless `attempts` is set).

    Once connected, nats-py reconnects on its own; disconnects and reconnects are logged.
    """
    urls = [servers] if isinstance(servers, str) else list(servers)
    auth = {**credential_options(creds), **tls_options(tls_ca)}
    delay = _FIRST_RETRY_S
    attempt = 0
    while True:
        attempt += 1
        try:
            nc = Client()
            # what the server said (an authorization violation), or a TLS handshake that failed
            # (a server whose certificate the bus CA did not sign)
            refusals: list[str] = []
            refused = asyncio.Event()

            async def _on_error(
                exc: Exception, refusals: list[str] = refusals, refused: asyncio.Event = refused
            ) -> None:
                text = str(exc) or type(exc).__name__
                if "authorization" in text.lower() or isinstance(exc, ssl.SSLError):
                    refusals.append(text)
                    refused.set()
                log.warning("nats error", error=text)

            async def _on_disconnected(nc: Client = nc) -> None:
                if not (nc.is_closed or nc.is_draining):  # our own close is not news
                    log.warning("nats disconnected")

            connecting = nc.connect(
                urls,
                name=name,
                connect_timeout=connect_timeout,
                allow_reconnect=True,
                max_reconnect_attempts=1,  # the first connect tries the pool once, then our backoff
                reconnect_time_wait=1,
                ping_interval=PING_INTERVAL_S,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                error_cb=_on_error,
                disconnected_cb=_on_disconnected,
                reconnected_cb=_on_reconnected,
                **auth,
            )
            await _unless_refused(connecting, nc, refused)
            nc.options["max_reconnect_attempts"] = -1  # once connected, reconnect forever
            return nc
        except Exception as exc:  # nats-py raises several unrelated types for "no server"
            if attempts is not None and (attempt >= attempts or refusals):  # a refusal is final
                reason = refusals[-1] if refusals else str(exc) or type(exc).__name__
                raise ConnectionError(f"cannot reach NATS at {_shown(urls)}: {reason}") from exc
            log.warning(
                "nats unreachable, retrying",
                servers=_shown(urls),
                error=refusals[-1] if refusals else str(exc) or type(exc).__name__,
                retry_in_s=delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY_S)


async def _unless_refused(connecting: Awaitable[None], nc: Client, refused: asyncio.Event) -> None:
    """Await `connecting`, or stop it at a refusal: after a failed TLS handshake nats-py's connect
    may never return (nats-py 2.x closes the client, then waits on its socket)."""
    task = asyncio.ensure_future(connecting)
    waiter = asyncio.ensure_future(refused.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if task.done():
        task.result()
        return
    with contextlib.suppress(Exception):  # cancelled again until it ends: see mohawk_common.tasks
        await cancel_and_wait(task)
    with contextlib.suppress(Exception):
        await nc.close()
    raise ConnectionError("refused")


async def connect_or_give_up(
    servers: Sequence[str],
    *,
    name: str,
    deadline_s: float,
    creds: str | Path | None = None,
    tls_ca: str | Path | None = None,
) -> Client:
    """For one-shot operator commands: three quick tries, and ConnectionError by `deadline_s` at
    the latest (nats-py alone may keep retrying an unreachable server for a long time)."""
    try:
        async with asyncio.timeout(deadline_s):
            return await connect(
                servers, name=name, attempts=3, connect_timeout=1, creds=creds, tls_ca=tls_ca
            )
    except TimeoutError:
        raise ConnectionError(f"cannot reach NATS at {_shown(servers)} within {deadline_s:.0f} s") from None


def _shown(urls: Sequence[str]) -> str:
    return redact_url(", ".join(urls))


async def _on_reconnected() -> None:
    log.info("nats reconnected")


async def server_has_all(nc: Client, timeout_s: float = 10.0) -> None:
    """Return once the server has every command `nc` wrote so far (its SUBs above all).

    nats-py's `flush()` is not that barrier: it writes its PING straight to the socket, ahead of
    the commands still in the client's buffer (`_send_ping` in nats-py 2.13.1 to 2.16.0 at least),
    so its PONG can come back before a just-made subscription reaches the server, and another
    connection's request then meets "no responders". The buffer is written out first, then the
    PING/PONG round trip.
    """
    async with asyncio.timeout(timeout_s):
        await nc._flush_pending(force_flush=True)  # no public call writes the buffer and waits
        await nc.flush(timeout=max(1, int(timeout_s)))
