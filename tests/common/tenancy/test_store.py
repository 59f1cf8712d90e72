"""Tenants and API keys in a real Redis: add, list, update, rotate, remove, and `by_key` through an
outage (the redis-server killed): keys seen before still answer, a key never seen is unavailable."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
import redis.asyncio as redis

from mohawk_cli.redis_server import RedisServer
from mohawk_common.errors import MohawkError
from mohawk_common.tenancy import (
    TenancyError,
    TenancyUnavailable,
    Tenant,
    TenantExists,
    TenantNotFound,
    TenantStore,
    connect,
    hash_api_key,
    new_api_key,
)

T = TypeVar("T")


def with_store(redis_url: str, body: Callable[[TenantStore, redis.Redis], Awaitable[T]]) -> T:
    async def run() -> T:
        client = connect(redis_url)
        try:
            return await body(TenantStore(client, retry_s=0.0), client)
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_api_keys_are_random_and_only_their_hash_is_stored(redis_url: str) -> None:
    assert new_api_key() != new_api_key() and new_api_key().startswith("mk-")
    assert len(new_api_key()) == 3 + 43
    assert hash_api_key("mk-abc") == hashlib.sha256(b"mk-abc").hexdigest()

    async def body(store: TenantStore, client: redis.Redis) -> None:
        tenant, key = await store.add(
            "acme", rpm=60, tpm=10_000, max_concurrency=4, priority="high", weight=2
        )
        assert tenant == Tenant(
            name="acme",
            rpm=60,
            tpm=10_000,
            max_concurrency=4,
            priority="high",
            weight=2.0,
            key_prefix=key[:8],
            created=tenant.created,
            id=tenant.id,
        )
        assert re.fullmatch(r"ten_[0-9a-f]{32}", tenant.id) and tenant.owner_id == tenant.id
        assert await client.smembers("mohawk:tenants") == {b"acme"}
        assert await client.get(f"mohawk:apikey:{hash_api_key(key)}") == b"acme"
        record = await client.hgetall("mohawk:tenant:acme")
        assert record[b"key_sha256"] == hash_api_key(key).encode()
        dump = repr([*(await client.keys("*")), *record.values()])
        assert key not in dump and key[3:] not in dump  # the key itself is nowhere in Redis
        assert await store.get("acme") == tenant
        assert await store.by_key(key) == tenant
        assert await store.by_key("mk-not-a-key") is None

    with_store(redis_url, body)


def test_add_list_update_rotate_remove(redis_url: str) -> None:
    async def body(store: TenantStore, client: redis.Redis) -> None:
        _, beta_key = await store.add("beta")
        await store.add("alpha", tpm=500)
        with pytest.raises(TenantExists, match="already exists"):
            await store.add("beta", rpm=1)
        assert [t.name for t in await store.list()] == ["alpha", "beta"]
        assert (await store.get("beta")) == (await store.by_key(beta_key))
        assert (await store.get("beta")) is not None and (await store.get("nobody")) is None

        updated = await store.update("beta", rpm=5, priority="low")
        assert (updated.rpm, updated.priority, updated.tpm) == (5, "low", None)
        assert await store.by_key(beta_key) == updated  # limits apply from the next lookup on

        new_key = await store.rotate_key("beta")
        assert new_key != beta_key
        assert await store.by_key(beta_key) is None  # the old key stops at once
        rotated = await store.by_key(new_key)
        assert rotated is not None and rotated.key_prefix == new_key[:8] and rotated.rpm == 5
        assert await client.exists(f"mohawk:apikey:{hash_api_key(beta_key)}") == 0

        await store.remove("beta")
        assert await store.by_key(new_key) is None and await store.get("beta") is None
        assert [t.name for t in await store.list()] == ["alpha"]
        assert await client.keys("mohawk:*beta*") == []
        for missing in (store.remove("beta"), store.rotate_key("beta"), store.update("beta", rpm=1)):
            with pytest.raises(TenantNotFound, match="no tenant 'beta'"):
                await missing

    with_store(redis_url, body)


@pytest.mark.parametrize(
    ("name", "limits", "problem"),
    [
        ("Acme", {}, "name"),
        ("-acme", {}, "name"),
        ("a" * 65, {}, "name"),
        ("acme", {"rpm": 0}, "rpm"),
        ("acme", {"weight": 0}, "weight"),
        ("acme", {"priority": "urgent"}, "priority"),
    ],
)
def test_bad_names_and_limits_are_refused_in_one_line(
    redis_url: str, name: str, limits: dict[str, object], problem: str
) -> None:
    async def body(store: TenantStore, client: redis.Redis) -> None:
        with pytest.raises(TenancyError, match=f"invalid tenant: {problem}") as caught:
            await store.add(name, **limits)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value) and isinstance(caught.value, MohawkError)
        assert await client.keys("*") == []

    with_store(redis_url, body)


def test_update_changes_only_limits(redis_url: str) -> None:
    async def body(store: TenantStore, client: redis.Redis) -> None:
        await store.add("acme")
        with pytest.raises(TenancyError, match="cannot change name"):
            await store.update("acme", name="other")
        with pytest.raises(TenancyError, match="invalid tenant: tpm"):
            await store.update("acme", tpm=-1)

    with_store(redis_url, body)


def test_by_key_answers_from_memory_while_redis_is_down(redis_server: RedisServer, redis_url: str) -> None:
    async def body(store: TenantStore, client: redis.Redis) -> None:
        tenant, key = await store.add("acme", rpm=10)
        _, other_key = await store.add("other")
        assert await store.by_key(key) == tenant  # seen once: remembered
        redis_server.kill()
        assert await store.by_key(key) == tenant
        with pytest.raises(TenancyUnavailable, match="not seen before"):
            await store.by_key(other_key)
        with pytest.raises(TenancyUnavailable, match="unreachable"):
            await store.list()
        redis_server.start()  # empty again: --save "" keeps nothing
        assert await store.by_key(key) is None  # Redis answers again, and it no longer knows the key
        redis_server.kill()
        with pytest.raises(TenancyUnavailable):
            await store.by_key(key)  # forgotten once Redis said it was gone

    with_store(redis_url, body)


def test_two_operators_adding_one_name_at_once_make_one_tenant(redis_url: str) -> None:
    async def body(store: TenantStore, client: redis.Redis) -> None:
        other = connect(redis_url)
        try:
            results = await asyncio.gather(
                store.add("race", rpm=1), TenantStore(other).add("race", rpm=2), return_exceptions=True
            )
        finally:
            await other.aclose()
        winners = [r for r in results if isinstance(r, tuple)]
        assert len(winners) == 1 and isinstance(next(r for r in results if r not in winners), TenantExists)
        tenant, key = winners[0]
        assert await store.by_key(key) == tenant == await store.get("race")
        assert len(await client.keys("mohawk:apikey:*")) == 1

    with_store(redis_url, body)


def test_a_tenant_keeps_its_id_and_one_added_again_under_its_name_gets_another(redis_url: str) -> None:
    async def body(store: TenantStore, client: redis.Redis) -> None:
        first, _ = await store.add("acme")
        assert (await store.update("acme", rpm=5)).id == first.id
        await store.rotate_key("acme")
        current = await store.get("acme")
        assert current is not None and current.id == first.id
        await store.remove("acme")
        again, _ = await store.add("acme")
        assert again.id != first.id and again.owner_id != first.owner_id

    with_store(redis_url, body)


def test_a_tenant_stored_before_ids_is_owned_by_name_and_creation_time() -> None:
    legacy = Tenant.model_validate_json('{"name": "acme", "created": 1700000000.25}')
    assert legacy.id == "" and legacy.owner_id == "acme@1700000000.25"
    recreated = Tenant.model_validate_json('{"name": "acme", "created": 1700000100.5}')
    assert recreated.owner_id != legacy.owner_id
