"""Rate limits every gateway shares: requests, tokens and concurrent requests a tenant may use.

Design. Each limited tenant has up to four records in Redis (braces keep them in one cluster slot):

    mohawk:ratelimit:{<tenant>}:requests     hash    a token bucket of rpm requests (`level`, `ts`)
    mohawk:ratelimit:{<tenant>}:tokens       hash    the last minute's charges: request id -> tokens,
                                                     and `total`
    mohawk:ratelimit:{<tenant>}:token_log    zset    the same request ids, scored by when charged
    mohawk:ratelimit:{<tenant>}:concurrency  zset    the running requests, scored by when they lapse

`acquire` runs one Lua script (buckets.py) that refills the requests bucket to now, drops the
token charges older than a minute, checks all three limits and, only when every one admits the
request, takes one request, records the tokens asked for (the prompt plus the most the completion
may use) and takes a slot, atomically against every other gateway; a refusal takes nothing. So no
minute, the tenant's first included, holds charges of more than its tpm. A request that sets no
completion limit is admitted for a floor and then `extend`ed to its cap (`completion_cap`: what
the context leaves, at most the whole tpm) or to what the tenant's window has left, whichever is
less; its completion limit is what it was granted. `release` frees the slot and settles the charge
to what the request used: the rest goes back to the window, and what it used beyond the charge
overdraws it, so the tenant's next request waits until enough charges have lapsed. A request
asking for more tokens than the tenant's whole tpm is refused for "tokens" with an infinite
`retry_after_s` and no Retry-After header: no wait would ever admit it. A slot lapses by itself
after `slot_lifetime_s`, which is how a crashed gateway's slots come back.

Redis unreachable: `acquire` and `release` never raise. They fall back to buckets in this process
(`LocalBuckets`), built from the limits of the Tenant the caller passes (its last known one), so
each gateway enforces the limits alone, and a tenant may get up to N times its limits across N
gateways, until Redis answers again. The outage is logged once when it starts and once when it
ends; meanwhile Redis is tried again every `retry_s`. A lease is released where it was taken: one
taken locally, locally; one taken from Redis whose release fails keeps its slot until the slot
lapses, and its charge stays what it was (an extension that fails leaves the request its floor).
"""

from __future__ import annotations

import dataclasses
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
    EXTEND_SCRIPT,
    MINUTE_S,
    NO_REQUESTS,
    NO_SLOT,
    NO_TOKENS,
    RELEASE_SCRIPT,
    Grant,
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
    """One limit for the headers: its size, what is left, and seconds until it is whole again."""

    limit: int
    remaining: int
    reset_s: float

    @staticmethod
    def of(capacity: int | None, level: float, minute_s: float = MINUTE_S) -> LimitState | None:
        """`level` may be below zero (an overrun being paid back): 0 remaining, a longer reset."""
        if capacity is None:
            return None
        return LimitState(capacity, math.floor(max(0.0, level)), (capacity - level) * minute_s / capacity)

    @staticmethod
    def of_window(capacity: int | None, left: float, reset_s: float) -> LimitState | None:
        """A sliding window: `left` may be below zero (an overrun waiting to lapse): 0 remaining."""
        if capacity is None:
            return None
        return LimitState(capacity, math.floor(max(0.0, left)), reset_s)


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
        self._extend = redis.register_script(EXTEND_SCRIPT)
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

    async def extend(self, tenant: Tenant, decision: RateDecision, most_tokens: int) -> RateDecision:
        """Grow an admitted request's charge towards `most_tokens`, as far as the tenant's window
        has tokens left (never below what it holds); the decision with its new charge and headers.
        """
        lease = decision.lease
        if tenant.tpm is None or not decision.allowed or most_tokens <= lease.charged_tokens:
            return decision
        grant = None
        if lease.local:
            grant = self._local.extend(tenant, lease.request_id, lease.charged_tokens, most_tokens)
        elif self._outage.should_try():
            grant = await self._extend_shared(tenant, lease, most_tokens)
        if grant is None:
            return decision
        return dataclasses.replace(
            decision,
            lease=dataclasses.replace(lease, charged_tokens=grant.charged),
            tokens=LimitState.of_window(tenant.tpm, grant.tokens, grant.tokens_reset_s),
        )

    async def release(self, tenant: Tenant, lease: RateLease, used_tokens: int) -> None:
        """End a lease: free its slot and settle its charge to the tokens it used, giving back the
        rest or overdrawing the window by what it used beyond the charge."""
        used = max(0, used_tokens) if tenant.tpm is not None else 0
        if not lease.holds_slot and used == lease.charged_tokens:
            return
        if lease.local:
            self._local.release(tenant, lease.request_id, lease.charged_tokens, used)
            return
        if not self._outage.should_try():
            return  # the slot lapses by itself
        keys = [limit_key(tenant.name, kind) for kind in ("tokens", "token_log", "concurrency")]
        args: list[str | int] = [
            tenant.tpm or 0,
            lease.request_id,
            lease.charged_tokens,
            used,
            self._minute_ms,
        ]
        try:
            await self._release(keys=keys, args=args)
        except RedisError as exc:
            self._outage.failed(exc)
        else:
            self._outage.succeeded()

    async def _acquire_shared(self, tenant: Tenant, tokens: int, request_id: str) -> Outcome | None:
        """The shared buckets' answer, or None when Redis cannot be reached."""
        if not self._outage.should_try():
            return None
        keys = [limit_key(tenant.name, kind) for kind in ("requests", "tokens", "token_log", "concurrency")]
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

    async def _extend_shared(self, tenant: Tenant, lease: RateLease, most_tokens: int) -> Grant | None:
        keys = [limit_key(tenant.name, kind) for kind in ("tokens", "token_log")]
        args: list[str | int] = [
            tenant.tpm or 0,
            lease.request_id,
            lease.charged_tokens,
            most_tokens,
            self._minute_ms,
        ]
        try:
            reply = await self._extend(keys=keys, args=args)
        except RedisError as exc:
            self._outage.failed(exc)
            return None
        self._outage.succeeded()
        return Grant.from_script(reply)

    @property
    def _minute_ms(self) -> int:
        return max(1, round(self.minute_s * 1000))


def completion_cap(num_prompt: int, max_model_len: int | None, tpm: int | None) -> int | None:
    """The most a request that sets no completion limit may be granted: what the context leaves
    after the prompt, and no more than the tenant's tokens a minute leave after it (at least 1, so
    that a prompt alone over the tpm is refused as never admissible); None when neither bounds it.
    What it is granted is then bounded by the tenant's window too (`RateLimiter.extend`)."""
    bounds = [limit - num_prompt for limit in (max_model_len, tpm) if limit is not None]
    return max(1, min(bounds)) if bounds else None


def _decide(
    tenant: Tenant, tokens: int, outcome: Outcome, request_id: str, local: bool, minute_s: float
) -> RateDecision:
    requests_state = LimitState.of(tenant.rpm, outcome.requests, minute_s)
    tokens_state = LimitState.of_window(tenant.tpm, outcome.tokens, outcome.tokens_reset_s)
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
            retry_after_s = max(outcome.tokens_wait_s, 0.001)  # until enough charges have lapsed
            detail = (
                f"{tokens} tokens asked, {max(0, math.floor(outcome.tokens))} of {tenant.tpm} per minute left"
            )
    return RateDecision(
        False,
        RateLease(request_id, local=local),
        reason=reason,
        retry_after_s=retry_after_s,
        requests=requests_state,
        tokens=tokens_state,
        detail=detail,
    )
