"""Tenants and their API keys in Redis, shared by every gateway and by `mohawk tenant`.

Design. Everything lives under the `mohawk:` prefix:

    mohawk:tenants              set     every tenant's name
    mohawk:tenant:<name>        hash    `tenant`: the Tenant as JSON; `key_sha256`: its key's hash
    mohawk:apikey:<sha256>      string  the name of the tenant holding that key

A key is shown once, when it is made; Redis only ever holds its SHA-256. `add`, `update`,
`rotate_key` and `remove` each run as one MULTI/EXEC under WATCH of the tenant's hash, so a key
and its tenant never disagree and two operators racing on one name cannot both win. `by_key`, the
gateway's question on every request, asks Redis whenever Redis answers, so a rotated key or a
removed tenant stops working at once on every gateway. It also remembers what it last read for
each key: while Redis is unreachable a key seen before keeps its last known tenant, and a key never
seen raises TenancyUnavailable (the gateway answers 503: it cannot tell a good key from a bad one).
After a failure Redis is asked again only every `retry_s`, so an outage costs one connect timeout
now and then, not one per request. The operator's methods raise TenancyUnavailable when Redis
cannot be reached.
"""

from __future__ import annotations

import builtins
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from mohawk_common.tenancy.errors import TenancyError, TenancyUnavailable, TenantExists, TenantNotFound
from mohawk_common.tenancy.keys import display_prefix, hash_api_key, new_api_key
from mohawk_common.tenancy.outage import Outage
from mohawk_common.tenancy.tenants import LIMIT_FIELDS, Priority, Tenant, make_tenant, new_tenant_id

T = TypeVar("T")

PREFIX = "mohawk:"
TENANTS_KEY = f"{PREFIX}tenants"
REMEMBERED_KEYS = 10_000  # keys `by_key` remembers for an outage, least recently used dropped first


def tenant_key(name: str) -> str:
    return f"{PREFIX}tenant:{name}"


def api_key_key(key_hash: str) -> str:
    return f"{PREFIX}apikey:{key_hash}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class TenantStore:
    def __init__(
        self, redis: redis.Redis, *, retry_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.redis = redis
        self._outage = Outage("API keys seen before keep their last known tenant", retry_s, clock)
        self._seen: OrderedDict[str, Tenant] = OrderedDict()  # key hash -> tenant, as last read

    async def add(
        self,
        name: str,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        max_concurrency: int | None = None,
        priority: Priority = "normal",
        weight: float = 1.0,
        ttft_objective_s: float | None = None,
    ) -> tuple[Tenant, str]:
        """A new tenant and its API key, the only time the key is ever returned; TenantExists if
        the name is taken. The tenant gets a new id, whatever tenant held its name before."""
        api_key = new_api_key()
        tenant = make_tenant(
            id=new_tenant_id(),
            name=name,
            rpm=rpm,
            tpm=tpm,
            max_concurrency=max_concurrency,
            priority=priority,
            weight=weight,
            ttft_objective_s=ttft_objective_s,
            key_prefix=display_prefix(api_key),
        )
        key_hash = hash_api_key(api_key)

        async def write(pipe: Pipeline) -> None:
            if await pipe.exists(tenant_key(name)):
                raise TenantExists(f"tenant '{name}' already exists")
            pipe.multi()
            pipe.hset(tenant_key(name), mapping={"tenant": tenant.model_dump_json(), "key_sha256": key_hash})
            pipe.set(api_key_key(key_hash), name)
            pipe.sadd(TENANTS_KEY, name)

        await self._transact(write, name)
        return tenant, api_key

    async def get(self, name: str) -> Tenant | None:
        """The tenant, or None when there is none of that name."""
        raw = await self._call(lambda: self.redis.hget(tenant_key(name), "tenant"))
        return None if raw is None else Tenant.model_validate_json(raw)

    async def list(self) -> builtins.list[Tenant]:
        """Every tenant, by name."""

        async def read() -> builtins.list[Any]:
            names = sorted(_text(n) for n in await self.redis.smembers(TENANTS_KEY))
            async with self.redis.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hget(tenant_key(name), "tenant")
                return list(await pipe.execute())

        return [Tenant.model_validate_json(raw) for raw in await self._call(read) if raw is not None]

    async def update(self, name: str, /, **changes: Any) -> Tenant:
        """Change some of the tenant's limits (`LIMIT_FIELDS`: rpm, tpm, max_concurrency, priority,
        weight, ttft_objective_s); the
        gateways apply them from the next request on."""
        unknown = sorted(set(changes) - set(LIMIT_FIELDS))
        if unknown:
            raise TenancyError(f"cannot change {', '.join(unknown)}; only {', '.join(LIMIT_FIELDS)}")

        async def write(pipe: Pipeline) -> Tenant:
            tenant, _ = await self._read(pipe, name)
            changed = make_tenant(**{**tenant.model_dump(), **changes})
            pipe.multi()
            pipe.hset(tenant_key(name), "tenant", changed.model_dump_json())
            return changed

        return await self._transact(write, name)

    async def rotate_key(self, name: str) -> str:
        """A new API key for the tenant; the old one stops working at once."""
        api_key = new_api_key()
        key_hash = hash_api_key(api_key)

        async def write(pipe: Pipeline) -> None:
            tenant, old_hash = await self._read(pipe, name)
            rotated = tenant.model_copy(update={"key_prefix": display_prefix(api_key)})
            pipe.multi()
            pipe.delete(api_key_key(old_hash))
            pipe.set(api_key_key(key_hash), name)
            pipe.hset(tenant_key(name), mapping={"tenant": rotated.model_dump_json(), "key_sha256": key_hash})

        await self._transact(write, name)
        self._forget(name)
        return api_key

    async def remove(self, name: str) -> None:
        """Delete the tenant and its key."""

        async def write(pipe: Pipeline) -> None:
            _, key_hash = await self._read(pipe, name)
            pipe.multi()
            pipe.delete(tenant_key(name), api_key_key(key_hash))
            pipe.srem(TENANTS_KEY, name)

        await self._transact(write, name)
        self._forget(name)

    async def by_key(self, api_key: str) -> Tenant | None:
        """The tenant holding `api_key`, or None for a key nobody holds; from memory while Redis is
        unreachable, and TenancyUnavailable for a key not seen before then."""
        key_hash = hash_api_key(api_key)
        if self._outage.should_try():
            try:
                tenant = await self._lookup(key_hash)
            except RedisError as exc:
                self._outage.failed(exc)
            else:
                self._outage.succeeded()
                self._remember(key_hash, tenant)
                return tenant
        if key_hash in self._seen:
            self._seen.move_to_end(key_hash)
            return self._seen[key_hash]
        raise TenancyUnavailable("Redis is unreachable and this API key was not seen before")

    async def _lookup(self, key_hash: str) -> Tenant | None:
        name = await self.redis.get(api_key_key(key_hash))
        if name is None:
            return None
        raw = await self.redis.hget(tenant_key(_text(name)), "tenant")
        return None if raw is None else Tenant.model_validate_json(raw)

    def _remember(self, key_hash: str, tenant: Tenant | None) -> None:
        if tenant is None:
            self._seen.pop(key_hash, None)  # revoked: not even an outage brings it back
            return
        self._seen[key_hash] = tenant
        self._seen.move_to_end(key_hash)
        while len(self._seen) > REMEMBERED_KEYS:
            self._seen.popitem(last=False)

    def _forget(self, name: str) -> None:
        for key_hash in [h for h, tenant in self._seen.items() if tenant.name == name]:
            del self._seen[key_hash]

    @staticmethod
    async def _read(pipe: Pipeline, name: str) -> tuple[Tenant, str]:
        """The tenant and its key's hash, read inside a WATCH; TenantNotFound when absent."""
        record = {_text(field): value for field, value in (await pipe.hgetall(tenant_key(name))).items()}
        if not record:
            raise TenantNotFound(f"no tenant '{name}'")
        return Tenant.model_validate_json(record["tenant"]), _text(record["key_sha256"])

    async def _transact(self, write: Callable[[Pipeline], Awaitable[T]], name: str) -> T:
        """Run `write` as one MULTI/EXEC under WATCH of the tenant's hash, again if it changed."""
        result: T = await self._call(
            lambda: self.redis.transaction(write, tenant_key(name), value_from_callable=True)
        )
        return result

    async def _call(self, operation: Callable[[], Awaitable[T]]) -> T:
        try:
            return await operation()
        except RedisError as exc:
            raise TenancyUnavailable(f"Redis is unreachable: {exc}") from exc
