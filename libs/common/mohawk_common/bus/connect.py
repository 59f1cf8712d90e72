"""Connecting to NATS: keep trying, one clear log line per failed attempt, never a traceback loop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog
from nats.aio.client import Client

log = structlog.get_logger("mohawk.bus")

_FIRST_RETRY_S = 0.5
_MAX_RETRY_S = 5.0


async def connect(
    servers: str | Sequence[str], *, name: str, attempts: int | None = None, connect_timeout: int = 2
) -> Client:
    """Connect to `servers`, retrying with backoff (forever unless `attempts` is set).

    Once connected, nats-py reconnects on its own; disconnects and reconnects are logged.
    """
    urls = [servers] if isinstance(servers, str) else list(servers)
    delay = _FIRST_RETRY_S
    attempt = 0
    while True:
        attempt += 1
        try:
            nc = Client()

            async def _on_disconnected(nc: Client = nc) -> None:
                if not (nc.is_closed or nc.is_draining):  # our own close is not news
                    log.warning("nats disconnected")

            await nc.connect(
                urls,
                name=name,
                connect_timeout=connect_timeout,
                allow_reconnect=True,
                max_reconnect_attempts=1,  # the first connect tries the pool once, then our backoff
                reconnect_time_wait=1,
                error_cb=_on_error,
                disconnected_cb=_on_disconnected,
                reconnected_cb=_on_reconnected,
            )
            nc.options["max_reconnect_attempts"] = -1  # once connected, reconnect forever
            return nc
        except Exception as exc:  # nats-py raises several unrelated types for "no server"
            if attempts is not None and attempt >= attempts:
                reason = str(exc) or type(exc).__name__
                raise ConnectionError(f"cannot reach NATS at {', '.join(urls)}: {reason}") from exc
            log.warning(
                "nats unreachable, retrying",
                servers=",".join(urls),
                error=str(exc) or type(exc).__name__,
                retry_in_s=delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY_S)


async def connect_or_give_up(servers: Sequence[str], *, name: str, deadline_s: float) -> Client:
    """For one-shot operator commands: three quick tries, and ConnectionError by `deadline_s` at
    the latest (nats-py alone may keep retrying an unreachable server for a long time)."""
    try:
        async with asyncio.timeout(deadline_s):
            return await connect(servers, name=name, attempts=3, connect_timeout=1)
    except TimeoutError:
        raise ConnectionError(
            f"cannot reach NATS at {', '.join(servers)} within {deadline_s:.0f} s"
        ) from None


async def _on_error(exc: Exception) -> None:
    log.warning("nats error", error=str(exc) or type(exc).__name__)


async def _on_reconnected() -> None:
    log.info("nats reconnected")
