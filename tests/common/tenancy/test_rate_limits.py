"""Rate limits in a real Redis: requests, tokens and concurrency, the OpenAI headers, two limiters
sharing one tenant's buckets, and the fallback to this process's buckets when the redis-server is
killed (no exception, the limits still hold) until it is back.

Most scenarios run twice: against Redis ("shared") and with Redis killed ("local"), because the
same rule is written once in Lua and once in Python.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from mohawk_cli.redis_server import RedisServer
from mohawk_common.tenancy import RateDecision, RateLimiter, Tenant, connect
from mohawk_common.tenancy.rate_limits import completion_cap, limit_key, openai_duration


def tenant(**limits: Any) -> Tenant:
    return Tenant(name="acme", **limits)


@asynccontextmanager
async def limiter(redis_url: str, **options: Any) -> AsyncIterator[RateLimiter]:
    client = connect(redis_url)
    try:
        yield RateLimiter(client, **{"retry_s": 0.0, **options})
    finally:
        await client.aclose()


def run(redis_url: str, body: Callable[[RateLimiter], Awaitable[None]], **options: Any) -> None:
    async def main() -> None:
        async with limiter(redis_url, **options) as rate_limiter:
            await body(rate_limiter)

    asyncio.run(main())


@pytest.fixture(params=["shared", "local"])
def mode(request: pytest.FixtureRequest, redis_server: RedisServer, redis_url: str) -> Iterator[str]:
    """ "shared": the limits live in Redis; "local": the redis-server is killed first."""
    if request.param == "local":
        redis_server.kill()
    yield request.param


def where(decision: RateDecision, mode: str) -> None:
    assert decision.lease.local == (mode == "local")


def test_past_its_rpm_a_tenant_is_refused_with_headers_and_retry_after(redis_url: str, mode: str) -> None:
    acme = tenant(rpm=2)

    async def body(limits: RateLimiter) -> None:
        first = await limits.acquire(acme, 100)
        assert first.allowed and first.reason is None
        where(first, mode)
        headers = first.headers()
        assert headers["x-ratelimit-limit-requests"] == "2"
        assert headers["x-ratelimit-remaining-requests"] == "1"
        assert headers["x-ratelimit-reset-requests"] == "30s"  # one of 2 used: full again in 30 s
        assert not any("tokens" in name for name in headers) and "Retry-After" not in headers
        assert (await limits.acquire(acme, 100)).allowed
        refused = await limits.acquire(acme, 100)
        assert not refused.allowed and refused.reason == "requests" and refused.admissible
        assert 0 < refused.retry_after_s <= 30  # one request comes back every 30 s at rpm 2
        assert refused.headers()["Retry-After"] == str(math.ceil(refused.retry_after_s))
        assert refused.headers()["x-ratelimit-remaining-requests"] == "0"
        assert refused.headers()["x-ratelimit-reset-requests"].endswith("s")

    run(redis_url, body)


def test_tokens_are_charged_up_front_refunded_on_release_and_a_refusal_takes_nothing(
    redis_url: str, mode: str
) -> None:
    acme = tenant(tpm=100)

    async def body(limits: RateLimiter) -> None:
        first = await limits.acquire(acme, 60)
        assert first.allowed and first.lease.charged_tokens == 60
        where(first, mode)
        assert first.headers()["x-ratelimit-remaining-tokens"] == "40"
        assert first.headers()["x-ratelimit-limit-tokens"] == "100"
        for _ in range(3):  # refusals consume nothing
            refused = await limits.acquire(acme, 50)
            assert not refused.allowed and refused.reason == "tokens"
            assert int(refused.headers()["x-ratelimit-remaining-tokens"]) >= 40
            assert int(refused.headers()["Retry-After"]) >= 1
        await limits.release(acme, first.lease, used_tokens=10)  # 50 of the 60 come back
        second = await limits.acquire(acme, 50)
        assert second.allowed
        assert int(second.headers()["x-ratelimit-remaining-tokens"]) in (40, 41)
        await limits.release(acme, second.lease, used_tokens=50)  # used all it was charged: nothing back
        assert int((await limits.acquire(acme, 0)).headers()["x-ratelimit-remaining-tokens"]) in (40, 41)

    run(redis_url, body)


def test_tokens_used_beyond_the_charge_overdraw_the_window_and_the_next_request_waits(
    redis_url: str, mode: str
) -> None:
    acme = tenant(tpm=100)

    async def body(limits: RateLimiter) -> None:
        first = await limits.acquire(acme, 60)
        assert first.allowed
        where(first, mode)
        await limits.release(acme, first.lease, used_tokens=160)  # 100 more than charged: 160 of 100
        overdrawn = await limits.acquire(acme, 0)
        assert not overdrawn.allowed  # even a request of no tokens waits for the overdraft
        assert overdrawn.headers()["x-ratelimit-remaining-tokens"] == "0"
        assert overdrawn.tokens is not None and 59.9 <= overdrawn.tokens.reset_s <= 60  # when 160 lapse
        refused = await limits.acquire(acme, 10)
        assert not refused.allowed and refused.reason == "tokens" and refused.admissible
        assert 59.9 <= refused.retry_after_s <= 60 and refused.headers()["Retry-After"] == "60"
        assert "0 of 100" in refused.detail

    run(redis_url, body)


def test_a_request_whose_charge_lapsed_while_it_ran_is_charged_its_overrun_at_release(
    redis_url: str, mode: str
) -> None:
    acme = tenant(tpm=100)
    minute_s = 0.2

    async def overrun(limits: RateLimiter) -> None:
        lease = (await limits.acquire(acme, 50)).lease
        await asyncio.sleep(1.5 * minute_s)  # its charge has left the window
        await limits.release(acme, lease, used_tokens=250)  # 200 beyond the charge: taken now
        refused = await limits.acquire(acme, 1)
        assert not refused.allowed and refused.reason == "tokens"
        assert 0.9 * minute_s <= refused.retry_after_s <= minute_s  # the 200 lapse a minute from now

    run(redis_url, overrun, minute_s=minute_s)


def test_an_unlimited_tenant_is_never_charged_at_release(redis_url: str) -> None:
    acme = tenant(rpm=10)  # requests limited, tokens not

    async def body(limits: RateLimiter) -> None:
        lease = (await limits.acquire(acme, 100)).lease
        assert lease.charged_tokens == 0
        await limits.release(acme, lease, used_tokens=10_000)
        assert (await limits.acquire(acme, 100)).tokens is None

    run(redis_url, body)


@pytest.mark.parametrize(
    ("num_prompt", "max_model_len", "tpm", "cap"),
    [
        (20, 2048, 400, 380),  # the tpm bounds it
        (20, 300, 400, 280),  # the context bounds it
        (20, None, 400, 380),
        (20, 2048, None, 2028),
        (20, None, None, None),  # nothing bounds it: the engine stops at the context
        (500, 2048, 400, 1),  # a prompt over the tpm: prompt + 1 is refused as never admissible
    ],
)
def test_a_request_without_max_tokens_is_capped_by_the_context_and_the_tpm(
    num_prompt: int, max_model_len: int | None, tpm: int | None, cap: int | None
) -> None:
    assert completion_cap(num_prompt, max_model_len, tpm) == cap


def test_a_request_without_max_tokens_is_granted_what_the_window_has_left(redis_url: str, mode: str) -> None:
    """The gateway's two steps: admit the prompt + a floor, then `extend` towards prompt + cap."""
    acme = tenant(tpm=400)

    async def body(limits: RateLimiter) -> None:
        explicit = await limits.acquire(acme, 100)  # another request, with max_tokens
        floor = await limits.acquire(acme, 20 + 80)
        where(floor, mode)
        granted = await limits.extend(acme, floor, 20 + 380)
        assert granted.lease.charged_tokens == 300  # its completion: 280, what 400 - 100 leaves
        assert granted.headers()["x-ratelimit-remaining-tokens"] == "0"
        await limits.release(acme, explicit.lease, used_tokens=40)  # 60 back
        # Two admitted at once: the first extended takes what is left, the other keeps its floor.
        one, other = await limits.acquire(acme, 20), await limits.acquire(acme, 20)
        assert [(await limits.extend(acme, d, 400)).lease.charged_tokens for d in (one, other)] == [40, 20]
        assert not (await limits.acquire(acme, 1)).allowed  # 40 + 300 + 40 + 20: all 400

    run(redis_url, body)


def test_a_tenant_omitting_max_tokens_gets_at_most_its_tpm_in_any_minute_the_first_included(
    redis_url: str, mode: str
) -> None:
    """The gateway's rule for requests without max_tokens (ignore_eos: each runs to its grant), the
    minute shortened to 1 s: admit prompt + a floor, extend towards prompt + cap (the context, the
    tpm) within what the window has left, charge what it generated. Every window of a minute is
    measured over the recorded charges (Redis's own times; the local rule's clock), not per
    calendar minute. Before the sliding window the first minute held 760 at tpm 400 (1.9x)."""
    tpm, num_prompt, estimate, context, minute_s, num_minutes = 400, 20, 256, 2048, 1.0, 4
    acme = tenant(tpm=tpm)
    fake_now = [0.0]
    charges: list[tuple[float, int]] = []  # (when charged, tokens) of each request

    async def body(limits: RateLimiter) -> None:
        def now() -> float:
            return fake_now[0] if mode == "local" else time.monotonic()

        start = now()
        while now() - start < num_minutes * minute_s:
            cap = completion_cap(num_prompt, context, acme.tpm)
            assert cap is not None
            decision = await limits.acquire(acme, num_prompt + min(cap, estimate))
            if not decision.allowed:
                assert decision.admissible and int(decision.headers()["Retry-After"]) >= 1
                if mode == "local":
                    fake_now[0] += decision.retry_after_s
                else:
                    await asyncio.sleep(decision.retry_after_s + 0.001)
                continue
            decision = await limits.extend(acme, decision, num_prompt + cap)
            used = decision.lease.charged_tokens  # ignore_eos: it generates every token granted
            charges.append((await charged_at(limits, decision, now()), used))
            await limits.release(acme, decision.lease, used_tokens=used)

    async def charged_at(limits: RateLimiter, decision: RateDecision, local_now: float) -> float:
        if mode == "local":
            return local_now
        score = await limits.redis.zscore(limit_key("acme", "token_log"), decision.lease.request_id)
        assert score is not None
        return float(score) / 1000

    run(redis_url, body, minute_s=minute_s, clock=lambda: fake_now[0])
    first = charges[0][0]
    per_minute = [
        sum(n for at, n in charges if k * minute_s <= at - first < (k + 1) * minute_s)
        for k in range(num_minutes)
    ]
    worst = max(sum(n for at, n in charges if start <= at < start + minute_s) for start, _ in charges)
    print(f"\ntpm {tpm} ({mode}): per minute {per_minute}, most in any minute {worst} ({worst / tpm:.2f}x)")
    assert worst <= tpm, (worst, charges)  # the goal, 1.0x; docs/api.md promises 1.25x
    assert all(n >= 0.9 * tpm for n in per_minute[: num_minutes - 1]), per_minute  # and it gets its tpm


def test_a_request_larger_than_the_whole_tpm_is_never_admissible(redis_url: str, mode: str) -> None:
    acme = tenant(tpm=100)

    async def body(limits: RateLimiter) -> None:
        never = await limits.acquire(acme, 101)
        assert not never.allowed and never.reason == "tokens" and not never.admissible
        assert math.isinf(never.retry_after_s) and "never" in never.detail and "101" in never.detail
        assert "Retry-After" not in never.headers()
        assert never.headers()["x-ratelimit-remaining-tokens"] == "100"
        assert (await limits.acquire(acme, 100)).allowed  # nothing was taken

    run(redis_url, body)


def test_concurrency_slots_are_held_until_release(redis_url: str, mode: str) -> None:
    acme = tenant(max_concurrency=2)

    async def body(limits: RateLimiter) -> None:
        leases = [await limits.acquire(acme, 10) for _ in range(2)]
        assert all(d.allowed and d.lease.holds_slot for d in leases)
        where(leases[0], mode)
        refused = await limits.acquire(acme, 10)
        assert not refused.allowed and refused.reason == "concurrency"
        assert refused.headers() == {"Retry-After": "1"}  # OpenAI has no concurrency headers
        await limits.release(acme, leases[0].lease, used_tokens=10)
        assert (await limits.acquire(acme, 10)).allowed
        assert not (await limits.acquire(acme, 10)).allowed

    run(redis_url, body)


def test_a_slot_never_released_lapses(redis_url: str, mode: str) -> None:
    acme = tenant(max_concurrency=1)

    async def body(limits: RateLimiter) -> None:
        assert (await limits.acquire(acme, 1)).allowed  # its gateway "crashes": never released
        await asyncio.sleep(0.02)
        assert (await limits.acquire(acme, 1)).allowed

    run(redis_url, body, slot_lifetime_s=0.005)


def test_charges_lapse_a_minute_after_they_were_made(redis_url: str, mode: str) -> None:
    acme = tenant(tpm=100)
    minute_s = 0.2

    async def body(limits: RateLimiter) -> None:
        assert (await limits.acquire(acme, 30)).allowed
        await asyncio.sleep(0.3 * minute_s)
        assert (await limits.acquire(acme, 40)).allowed
        refused = await limits.acquire(acme, 50)  # 30 left: it waits for the 30, not for both
        assert not refused.allowed and refused.admissible
        assert 0.6 * minute_s <= refused.retry_after_s <= 0.7 * minute_s
        assert refused.tokens is not None and 0.2 * minute_s < refused.tokens.reset_s <= minute_s
        await asyncio.sleep(refused.retry_after_s + 0.001)
        assert (await limits.acquire(acme, 50)).allowed

    run(redis_url, body, minute_s=minute_s)


def test_max_tokens_beyond_what_the_window_has_left_is_refused_with_retry_after(
    redis_url: str, mode: str
) -> None:
    acme = tenant(tpm=100)

    async def body(limits: RateLimiter) -> None:
        assert (await limits.acquire(acme, 70)).allowed
        refused = await limits.acquire(acme, 50)  # prompt + max_tokens: 50, with 30 left
        assert not refused.allowed and refused.reason == "tokens" and refused.admissible
        assert refused.headers()["Retry-After"] == "60"  # when the 70 lapse
        assert refused.headers()["x-ratelimit-remaining-tokens"] == "30"
        assert refused.detail == "50 tokens asked, 30 of 100 per minute left"
        assert (await limits.acquire(acme, 30)).allowed  # the refusal took nothing

    run(redis_url, body)


def test_an_unlimited_tenant_touches_nothing(redis_url: str) -> None:
    async def body(limits: RateLimiter) -> None:
        decision = await limits.acquire(tenant(), 10**9)
        assert decision.allowed and decision.headers() == {}
        await limits.release(tenant(), decision.lease, 0)
        assert await limits.redis.keys("*") == []

    run(redis_url, body)


def test_two_limiters_on_two_clients_share_one_tenants_limits(redis_url: str) -> None:
    acme = tenant(rpm=3, max_concurrency=10)

    async def main() -> None:
        async with limiter(redis_url) as one, limiter(redis_url) as two:
            assert one.redis is not two.redis
            allowed = [(await (one, two)[i % 2].acquire(acme, 1)).allowed for i in range(4)]
            assert allowed == [True, True, True, False]
            keys = sorted(await one.redis.keys("mohawk:ratelimit:*"))
            assert keys == [
                f"mohawk:ratelimit:{{acme}}:{kind}".encode() for kind in ("concurrency", "requests")
            ]

    asyncio.run(main())


def test_without_redis_limits_hold_locally_and_come_back_shared_after_a_restart(
    redis_server: RedisServer, redis_url: str
) -> None:
    acme = tenant(rpm=2, tpm=1_000)
    now = [0.0]

    async def main() -> None:
        async with limiter(redis_url, retry_s=5.0, clock=lambda: now[0] + time.monotonic()) as limits:
            assert (await limits.acquire(acme, 10)).lease.local is False
            redis_server.kill()
            outage = [await limits.acquire(acme, 10) for _ in range(3)]  # no exception
            assert limits.redis_down
            assert [d.allowed for d in outage] == [True, True, False]  # fresh local buckets: rpm 2
            assert all(d.lease.local for d in outage) and outage[2].reason == "requests"
            await limits.release(acme, outage[0].lease, used_tokens=1)  # released where it was taken
            redis_server.start()
            assert (await limits.acquire(acme, 10)).lease.local  # Redis not asked again until retry_s
            now[0] += 5.0
            back = await limits.acquire(acme, 10)
            assert back.allowed and not back.lease.local and not limits.redis_down
            await limits.release(acme, outage[1].lease, used_tokens=1)  # a local lease, after the outage

    asyncio.run(main())


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.12, "120ms"), (0.0004, "1ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"), (3725, "1h2m5s")],
)
def test_reset_durations_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert openai_duration(seconds) == text
