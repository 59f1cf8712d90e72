"""The sessions API's server side: session state in Redis, turns, statistics."""

from __future__ import annotations

import redis.asyncio as redis

from mohawk_gateway.config import GatewaySettings
from mohawk_gateway.errors import GatewayError
from mohawk_gateway.sessions.store import SessionStore
from mohawk_gateway.sessions.turns import BackgroundTurns


class Sessions:
    """This gateway's sessions: the shared store (none without Redis) and its asynchronous turns."""

    def __init__(self, settings: GatewaySettings, client: redis.Redis | None) -> None:
        self._store = (
            SessionStore(client, settings.session_ttl_s, settings.retry_after_s)
            if client is not None
            else None
        )
        self.background = BackgroundTurns()

    @property
    def store(self) -> SessionStore:
        """The session store, or 503 when this gateway runs without Redis."""
        if self._store is None:
            raise GatewayError(
                503,
                "sessions need a Redis: start the gateway with redis_url (MOHAWK_REDIS_URL); "
                "`mohawk up` does when redis-server is installed",
                code="sessions_unavailable",
            )
        return self._store

    async def close(self) -> None:
        await self.background.close()
