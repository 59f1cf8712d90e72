"""Sessions in Redis: every gateway reads and writes the same ones, and an idle one expires.

Layout (prefix `mohawk:session:<id>`): the state as JSON, with the session TTL, refreshed on
every use; `…:turn`, the lock one running turn holds (SET NX with the request timeout as its
expiry, so a crashed gateway's lock lapses); `…:request:<rid>`, an asynchronous turn's record,
with the session TTL. A turn's result is written only while the session still exists (SET XX),
so a session deleted mid-turn stays deleted. A Redis error becomes a 503, never a traceback.

A session id or request id from a URL reaches a key name only once it matches `SESSION_ID` or
`REQUEST_ID` (letters, digits, `_` and `-`: no `:` to reach another key, no glob characters); any
other is a 400 `invalid_session_id`. A session's TTL is renewed only after its owner is checked,
so another tenant's guesses never keep it alive.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as redis
from redis.exceptions import RedisError

from mohawk_gateway.errors import GatewayError, unavailable_after
from mohawk_gateway.sessions.state import RequestRecord, SessionState

T = TypeVar("T")
PREFIX = "mohawk:session:"
SESSION_ID = re.compile(r"sess_[A-Za-z0-9_-]{1,64}")  # the gateway makes sess_<32 hex digits>
REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def session_key(session_id: str) -> str:
    """The session's key; 400 for an id that is not one the gateway could have made."""
    if not SESSION_ID.fullmatch(session_id):
        raise GatewayError(
            400,
            "invalid session id: expected 'sess_' and 1 to 64 letters, digits, '_' or '-'",
            param="session_id",
            code="invalid_session_id",
        )
    return PREFIX + session_id


def request_key(session_id: str, request_id: str) -> str:
    if not REQUEST_ID.fullmatch(request_id):
        raise GatewayError(
            400,
            "invalid request id: expected 1 to 128 letters, digits, '_' or '-'",
            param="request_id",
            code="invalid_request_id",
        )
    return f"{session_key(session_id)}:request:{request_id}"


def not_found(session_id: str) -> GatewayError:
    return GatewayError(404, f"no session '{session_id}'", param="session_id", code="session_not_found")


class SessionStore:
    def __init__(self, client: redis.Redis, ttl_s: float, retry_after_s: int) -> None:
        self.client = client
        self.ttl_ms = int(ttl_s * 1000)
        self.retry_after_s = retry_after_s

    async def create(self, state: SessionState) -> None:
        key = session_key(state.id)
        await self._call(lambda: self.client.set(key, state.model_dump_json(), px=self.ttl_ms))

    async def get(self, session_id: str, owner_id: str) -> SessionState:
        """The session, its TTL renewed once `owner_id` is found to own it; 404 when absent,
        expired or someone else's (the TTL of someone else's is left as it was)."""
        key = session_key(session_id)
        raw = await self._call(lambda: self.client.get(key))
        if raw is None:
            raise not_found(session_id)
        state = SessionState.model_validate_json(raw)
        if state.owner_id != owner_id:
            raise not_found(session_id)
        await self._call(lambda: self.client.pexpire(key, self.ttl_ms))
        return state

    async def save(self, state: SessionState) -> bool:
        """Write a turn's result; False when the session was deleted meanwhile."""
        key = session_key(state.id)
        return bool(
            await self._call(lambda: self.client.set(key, state.model_dump_json(), px=self.ttl_ms, xx=True))
        )

    async def delete(self, session_id: str) -> None:
        key = session_key(session_id)
        await self._call(lambda: self.client.delete(key, f"{key}:turn"))

    async def lock_turn(self, session_id: str, request_id: str, hold_s: float) -> None:
        """Take the session's turn lock, or 409 while another turn runs."""
        key = f"{session_key(session_id)}:turn"
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
        key = f"{session_key(session_id)}:turn"

        async def release() -> None:
            if await self.client.get(key) == request_id.encode():
                await self.client.delete(key)

        await self._call(release)

    async def put_request(self, record: RequestRecord) -> None:
        key = request_key(record.session_id, record.id)
        await self._call(lambda: self.client.set(key, record.model_dump_json(), px=self.ttl_ms))

    async def get_request(self, session_id: str, request_id: str) -> RequestRecord:
        key = request_key(session_id, request_id)
        raw = await self._call(lambda: self.client.get(key))
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
