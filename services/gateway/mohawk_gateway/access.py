"""Who is calling, and how much they may ask for: API keys, tenants and rate limits at the gateway.

Design. Tenants, their keys (only a key's SHA-256 is stored) and their limits live in Redis
(`mohawk_common.tenancy`), so every gateway sees the same ones. With `auth` on, every /v1 call
must carry `Authorization: Bearer KEY`; no key or an unknown one is a 401 in OpenAI's shape
(`invalid_api_key`). With `auth` off the key is not checked, but one that names a tenant still
attributes the request to it (its limits, priority and weight apply); anything else runs as the
anonymous tenant, unlimited, normal priority, weight 1. A generation request takes a rate lease
once its prompt is tokenized, charging one request and its prompt tokens plus `max_tokens` (or
`token_estimate` when unset) against the tenant's buckets; the lease is released when the
generation closes, handing back the tokens it did not use. While Redis is unreachable, keys seen
before keep working with their last known limits, enforced by each gateway alone; a key never
seen gets 503 (it cannot be checked), never a crash.
"""

from __future__ import annotations

import hmac

import structlog

from mohawk_common.errors import ConfigError
from mohawk_common.tenancy import (
    RateDecision,
    RateLimiter,
    TenancyUnavailable,
    Tenant,
    TenantStore,
    connect,
    read_password,
)
from mohawk_gateway.config import GatewaySettings
from mohawk_gateway.errors import GatewayError, too_many_requests, unavailable_after

log = structlog.get_logger("mohawk.gateway")

_BEARER = "bearer "


def invalid_api_key(message: str) -> GatewayError:
    return GatewayError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def _redacted(key: str) -> str:
    return key if len(key) <= 10 else f"{key[:6]}...{key[-4:]}"


class Access:
    """The gateway's view of tenants: `authenticate` a caller, `admit` a request, `release` it."""

    def __init__(self, settings: GatewaySettings) -> None:
        if settings.auth and not settings.redis_url:
            raise ConfigError("auth needs a Redis for its tenants: set redis_url (MOHAWK_REDIS_URL)")
        self.settings = settings
        self.redis = (
            connect(
                settings.redis_url,
                password=read_password(settings.redis_password_file),
                tls_ca=settings.redis_tls_ca,
            )
            if settings.redis_url
            else None
        )
        self.tenants = TenantStore(self.redis) if self.redis is not None else None
        self.limiter = RateLimiter(self.redis) if self.redis is not None else None

    @property
    def enabled(self) -> bool:
        """Whether a Redis holds tenants (and sessions) for this gateway."""
        return self.redis is not None

    def check_metrics_key(self, authorization: str | None) -> None:
        """With auth on, /metrics (every tenant's traffic, cluster-wide) needs the operator's metrics
        key, never a tenant's: 401 for anything else, and always when no metrics key is set."""
        if not self.settings.auth:
            return
        key = _bearer_key(authorization).encode()
        expected = self.settings.metrics_key
        if expected is None or not key or not hmac.compare_digest(key, expected.get_secret_value().encode()):
            raise invalid_api_key(
                "/metrics needs the metrics key (Authorization: Bearer MOHAWK_METRICS_KEY), or "
                "scrape the gateway's metrics port"
            )

    async def authenticate(self, authorization: str | None) -> Tenant | None:
        """The calling tenant, or None (anonymous) when auth is off and the key names no tenant."""
        key = _bearer_key(authorization)
        if self.tenants is None:
            return None
        if not key:
            if self.settings.auth:
                raise invalid_api_key(
                    "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
                )
            return None
        try:
            tenant = await self.tenants.by_key(key)
        except TenancyUnavailable as exc:
            if not self.settings.auth:
                return None
            raise unavailable_after(
                "the API key cannot be checked now", exc, self.settings.retry_after_s
            ) from exc
        if tenant is None and self.settings.auth:
            raise invalid_api_key(f"Incorrect API key provided: {_redacted(key)}.")
        return tenant

    async def admit(self, tenant: Tenant | None, num_tokens: int) -> RateDecision | None:
        """A rate lease for one request of `num_tokens` (prompt + completion charged up front), or
        429 with Retry-After and OpenAI's x-ratelimit headers; None for the anonymous tenant."""
        if tenant is None or self.limiter is None:
            return None
        decision = await self.limiter.acquire(tenant, num_tokens)
        if not decision.admissible:  # more tokens than a whole minute's allowance: never admissible
            raise too_many_requests(
                "over_tenant_window", decision.detail, param="max_tokens", headers=decision.headers()
            )
        if not decision.allowed:
            raise too_many_requests(
                "tenant_rate_limit", _refusal(tenant, decision), headers=decision.headers()
            )
        return decision

    async def release(self, tenant: Tenant | None, decision: RateDecision | None, used_tokens: int) -> None:
        """End a lease: free its concurrency slot and give back the tokens it did not use."""
        if tenant is None or decision is None or self.limiter is None:
            return
        try:
            await self.limiter.release(tenant, decision.lease, used_tokens)
        except Exception as exc:  # a lost release only delays the slot's expiry
            log.warning("rate lease not released", tenant=tenant.name, error=str(exc))

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()


def _bearer_key(authorization: str | None) -> str:
    if not authorization or not authorization.lower().startswith(_BEARER):
        return ""
    return authorization[len(_BEARER) :].strip()


def _refusal(tenant: Tenant, decision: RateDecision) -> str:
    what = {
        "requests": f"requests per minute (limit {tenant.rpm})",
        "tokens": f"tokens per minute (limit {tenant.tpm})",
        "concurrency": f"concurrent requests (limit {tenant.max_concurrency})",
    }.get(decision.reason or "", "its rate limits")
    return (
        f"Rate limit reached for tenant '{tenant.name}' on {what}. "
        f"Please try again in {decision.retry_after_s:.3g}s."
    )
