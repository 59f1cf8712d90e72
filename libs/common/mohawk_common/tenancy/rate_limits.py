"""Rate limits every gateway shares: requests, tokens and concurrent requests a tenant may use.

Design. Each limited tenant has up to three records in Redis (braces keep them in one cluster slot):

    mohawk:ratelimit:{<tenant>}:requests     hash    a token bucket of rpm requests (`level`, `ts`)
    mohawk:ratelimit:{<tenant>}:tokens       hash    a token bucket of tpm tokens
    mohawk:ratelimit:{<tenant>}:concurrency  zset    the running requests, scored by when they lapse

`acquire` runs one Lua script (buckets.py) that refills the buckets to now, checks all three
limits and, only when every one admits the request, takes one request, the tokens asked for (the
prompt plus the most the completion may use, or an estimate when the request sets no limit) and a
slot, atomically against every other gateway; a refusal takes nothing. `release` frees the slot
and settles the tokens: it gives back what was charged and not used, and takes what was used
beyond the charge, so the bucket may go below zero and the tenant's next request waits until it
has refilled. A request that sets no completion limit gets one (`completion_cap`): what is left of
the context, and never more than the tenant's whole tpm, so one request cannot run on unpaid for
minutes. A request asking for more tokens than the tenant's whole tpm is refused for "tokens" with
an infinite `retry_after_s` and no Retry-After header: no wait would ever admit it. A slot lapses by
itself after `slot_lifetime_s`, which is how a crashed gateway's slots come back.

Redis unreachable: `acquire` and `release` never raise. They fall back to buckets in this process
(`LocalBuckets`), built from the limits of the Tenant the caller passes (its last known one), so
each gateway enforces the limits alone, and a tenant may get up to N times its limits across N
gateways, until Redis answers again. The outage is logged once when it starts and once when it
ends; meanwhile Redis is tried again every `retry_s`. A lease is released where it was taken: one
taken locally, locally; one taken from Redis whose release fails keeps its slot until the slot
lapses, and its unused tokens are not given back.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as redis
from redis.exceptions import RedisError

from mohawk_common.tenancy.buckets import (
    ACQUIRE_SCRIPT,
    ADMITTED,
    MINUTE_S,
    NO_REQUESTS,
    NO_SLOT,
    NO_TOKENS,
    RELEASE_SCRIPT,
    LocalBuckets,
    Outcome,
)
from mohawk_common.tenancy.outage import Outage
from mohawk_common.tenancy.store import PREFIX
from mohawk_common.tenancy.tenants import Tenant

Reason = Literal["requests", "tokens", "concurrency"]
_REASONS: dict[int, Reason] = {NO_REQUESTS: "requests", NO_TOKENS: "tokens", NO_SLOT: "concurrency"}
SLOT_RETRY_S = 1.0  # a refusal for concurrency: when to try again (a slot frees when a request ends)
DEFAULT_SLOT_LIFETIME_S = 900.0  # longer than any request may run (the gateway's request timeout)


def limit_key(tenant: str, kind: str) -> str:
    return f"{PREFIX}ratelimit:{{{tenant}}}:{kind}"


def openai_duration(seconds: float) -> str:
    """A duration as OpenAI's x-ratelimit-reset-* headers write it: "120ms", "1s", "1.5s", "6m0s"."""
    ms = max(0, math.ceil(seconds * 1000))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    minutes, secs = divmod(ms / 1000, 60)
    hours, minutes = divmod(int(minutes), 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


@dataclass(frozen=True)
class RateLease:
    """What an admitted request holds until `release`: its charged tokens, maybe a slot."""

    request_id: str
    charged_tokens: int = 0
    holds_slot: bool = False
    local: bool = False  # taken from this process's buckets while Redis was unreachable


@dataclass(frozen=True)
class LimitState:
    """One bucket for the headers: its size, what is left, and seconds until it is full again."""

    limit: int
    remaining: int
    reset_s: float

    @staticmethod
    def of(capacity: int | None, level: float, minute_s: float = MINUTE_S) -> LimitState | None:
        """`level` may be below zero (an overrun being paid back): 0 remaining, a longer reset."""
        if capacity is None:
            return None
        return LimitState(capacity, math.floor(max(0.0, level)), (capacity - level) * minute_s / capacity)


@dataclass(frozen=True)
class RateDecision:
    """Whether a request may run now; if not, why and for how long to wait."""

    allowed: bool
    lease: RateLease
    reason: Reason | None = None
    retry_after_s: float = 0.0  # math.inf: never (more tokens than the whole tpm)
    requests: LimitState | None = None
    tokens: LimitState | None = None
    detail: str = ""

    @property
    def admissible(self) -> bool:
        """False for a request no wait would admit."""
        return not math.isinf(self.retry_after_s)

    def headers(self) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers for the limits the tenant has, and Retry-After (whole
        seconds, at least 1) on a refusal that waiting can cure."""
        headers: dict[str, str] = {}
        for kind, state in (("requests", self.requests), ("tokens", self.tokens)):
            if state is not None:
                headers[f"x-ratelimit-limit-{kind}"] = str(state.limit)
                headers[f"x-ratelimit-remaining-{kind}"] = str(state.remaining)
                headers[f"x-ratelimit-reset-{kind}"] = openai_duration(state.reset_s)
        if not self.allowed and self.admissible:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return headers


class RateLimiter:
    def __init__(
        self,
        redis: redis.Redis,
        *,
        slot_lifetime_s: float = DEFAULT_SLOT_LIFETIME_S,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        minute_s: float = MINUTE_S,
    ) -> None:
        self.redis = redis
        self.slot_lifetime_s = slot_lifetime_s
        self.minute_s = minute_s  # how long an empty bucket takes to fill (shorter only in tests)
        self._acquire = redis.register_script(ACQUIRE_SCRIPT)
        self._release = redis.register_script(RELEASE_SCRIPT)
        self._outage = Outage("rate limits enforced by this process alone", retry_s, clock)
        self._local = LocalBuckets(clock, slot_lifetime_s, minute_s)

    @property
    def redis_down(self) -> bool:
        """Whether the last attempt to reach Redis failed (limits are then this process's own)."""
        return self._outage.down

    async def acquire(self, tenant: Tenant, tokens: int) -> RateDecision:
        """Admit one request of `tokens` (charged up front) for `tenant`, or say why not."""
        request_id = uuid.uuid4().hex
        if not tenant.is_limited:
            return RateDecision(True, RateLease(request_id))
        tokens = max(0, tokens)
        outcome = await self._acquire_shared(tenant, tokens, request_id)
        local = outcome is None
        if outcome is None:
            outcome = self._local.acquire(tenant, tokens, request_id)
        return _decide(tenant, tokens, outcome, request_id, local, self.minute_s)

    async def release(self, tenant: Tenant, lease: RateLease, used_tokens: int) -> None:
        """End a lease: free its slot, give back the tokens charged and not used, and take those
        used beyond the charge (the bucket may then hold less than nothing)."""
        back = lease.charged_tokens - max(0, used_tokens) if tenant.tpm is not None else 0
        if not lease.holds_slot and back == 0:
            return
        if lease.local:
            self._local.release(tenant, lease.request_id, back)
            return
        if not self._outage.should_try():
            return  # the slot lapses by itself
        keys = [limit_key(tenant.name, "tokens"), limit_key(tenant.name, "concurrency")]
        try:
            await self._release(keys=keys, args=[tenant.tpm or 0, back, lease.request_id, self._minute_ms])
        except RedisError as exc:
            self._outage.failed(exc)
        else:
            self._outage.succeeded()

    async def _acquire_shared(self, tenant: Tenant, tokens: int, request_id: str) -> Outcome | None:
        """The shared buckets' answer, or None when Redis cannot be reached."""
        if not self._outage.should_try():
            return None
        keys = [limit_key(tenant.name, kind) for kind in ("requests", "tokens", "concurrency")]
        limits = (tenant.rpm or 0, tenant.tpm or 0, tenant.max_concurrency or 0)
        lifetime_ms = math.ceil(self.slot_lifetime_s * 1000)
        try:
            reply = await self._acquire(
                keys=keys, args=[*limits, tokens, request_id, lifetime_ms, self._minute_ms]
            )
        except RedisError as exc:
            self._outage.failed(exc)
            return None
        self._outage.succeeded()
        return Outcome.from_script(reply)

    @property
    def _minute_ms(self) -> int:
        return max(1, round(self.minute_s * 1000))


def completion_cap(num_prompt: int, max_model_len: int | None, tpm: int | None) -> int | None:
    """The completion limit of a request that sets none: what the context leaves after the prompt,
    and no more than the tenant's tokens a minute leave after it (at least 1, so that a prompt
    alone over the tpm is refused as never admissible); None when neither bounds it."""
    bounds = [limit - num_prompt for limit in (max_model_len, tpm) if limit is not None]
    return max(1, min(bounds)) if bounds else None


def _decide(
    tenant: Tenant, tokens: int, outcome: Outcome, request_id: str, local: bool, minute_s: float
) -> RateDecision:
    requests_state = LimitState.of(tenant.rpm, outcome.requests, minute_s)
    tokens_state = LimitState.of(tenant.tpm, outcome.tokens, minute_s)
    if outcome.refused == ADMITTED:
        lease = RateLease(
            request_id,
            charged_tokens=tokens if tenant.tpm is not None else 0,
            holds_slot=tenant.max_concurrency is not None,
            local=local,
        )
        return RateDecision(True, lease, requests=requests_state, tokens=tokens_state)
    reason = _REASONS[outcome.refused]
    retry_after_s, detail = SLOT_RETRY_S, f"{tenant.max_concurrency} requests already running"
    if reason == "requests" and tenant.rpm is not None:
        retry_after_s = (1 - outcome.requests) * minute_s / tenant.rpm
        detail = f"the limit of {tenant.rpm} requests per minute is used up"
    elif reason == "tokens" and tenant.tpm is not None:
        if tokens > tenant.tpm:
            retry_after_s = math.inf
            detail = (
                f"the request needs {tokens} tokens, more than the limit of {tenant.tpm} tokens per "
                "minute: it can never be admitted; ask for fewer tokens (prompt + max_tokens)"
            )
        else:
            retry_after_s = (tokens - outcome.tokens) * minute_s / tenant.tpm
            detail = f"{tokens} tokens asked, {math.floor(outcome.tokens)} of {tenant.tpm} per minute left"
    return RateDecision(
        False,
        RateLease(request_id, local=local),
        reason=reason,
        retry_after_s=retry_after_s,
        requests=requests_state,
        tokens=tokens_state,
        detail=detail,
    )
