"""Sessions in Redis: every gateway reads and writes the same ones, and an idle one expires.

Layout (prefix `mohawk:session:<id>`): the state as JSON, with the session TTL, refreshed on
every use; `…:turn`, the lock one running turn holds (SET NX with the request timeout as its
expiry, so a crashed gateway's lock lapses); `…:request:<rid>`, an asynchronous turn's record,
with the session TTL. A turn's result is written only while the session still exists (SET XX),
so a session deleted mid-turn stays deleted. A Redis error becomes a 503, never a traceback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as redis
from redis.exceptions import RedisError

from mohawk_gateway.errors import GatewayError, unavailable_after
from mohawk_gateway.sessions.state import RequestRecord, SessionState

T = TypeVar("T")
PREFIX = "mohawk:session:"


def not_found(session_id: str) -> GatewayError:
    return GatewayError(404, f"no session '{session_id}'", param="session_id", code="session_not_found")


class SessionStore:
    def __init__(self, client: redis.Redis, ttl_s: float, retry_after_s: int) -> None:
        self.client = client
        self.ttl_ms = int(ttl_s * 1000)
        self.retry_after_s = retry_after_s

    async def create(self, state: SessionState) -> None:
        await self._call(lambda: self.client.set(PREFIX + state.id, state.model_dump_json(), px=self.ttl_ms))

    async def get(self, session_id: str, tenant: str) -> SessionState:
        """The session, its TTL renewed; 404 when absent, expired or another tenant's."""
        raw = await self._call(lambda: self.client.getex(PREFIX + session_id, px=self.ttl_ms))
        if raw is None:
            raise not_found(session_id)
        state = SessionState.model_validate_json(raw)
        if state.tenant != tenant:
            raise not_found(session_id)
        return state

    async def save(self, state: SessionState) -> bool:
        """Write a turn's result; False when the session was deleted meanwhile."""
        key = PREFIX + state.id
        return bool(
            await self._call(lambda: self.client.set(key, state.model_dump_json(), px=self.ttl_ms, xx=True))
        )

    async def delete(self, session_id: str) -> None:
        await self._call(lambda: self.client.delete(PREFIX + session_id, f"{PREFIX}{session_id}:turn"))

    async def lock_turn(self, session_id: str, request_id: str, hold_s: float) -> None:
        """Take the session's turn lock, or 409 while another turn runs."""
        key = f"{PREFIX}{session_id}:turn"
        taken = await self._call(lambda: self.client.set(key, request_id, nx=True, px=int(hold_s * 1000)))
        if not taken:
            raise GatewayError(
                409,
                f"session '{session_id}' is answering another turn; wait for it to finish",
                param="session_id",
                code="session_busy",
            )

    async def unlock_turn(self, session_id: str, request_id: str) -> None:
        """Release the lock if this request still holds it (a lapsed lock may be someone else's)."""
        key = f"{PREFIX}{session_id}:turn"

        async def release() -> None:
            if await self.client.get(key) == request_id.encode():
                await self.client.delete(key)

        await self._call(release)

    async def put_request(self, record: RequestRecord) -> None:
        key = f"{PREFIX}{record.session_id}:request:{record.id}"
        await self._call(lambda: self.client.set(key, record.model_dump_json(), px=self.ttl_ms))

    async def get_request(self, session_id: str, request_id: str) -> RequestRecord:
        raw = await self._call(lambda: self.client.get(f"{PREFIX}{session_id}:request:{request_id}"))
        if raw is None:
            raise GatewayError(
                404, f"no request '{request_id}' in session '{session_id}'", code="request_not_found"
            )
        return RequestRecord.model_validate_json(raw)

    async def _call(self, operation: Callable[[], Awaitable[T]]) -> T:
        try:
            return await operation()
        except RedisError as exc:
            raise unavailable_after("the session store is unreachable", exc, self.retry_after_s) from exc
