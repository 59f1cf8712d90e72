"""Tenants, their API keys and their rate limits, in a Redis every gateway shares.

`TenantStore` keeps tenants and the SHA-256 of their keys (store.py has the Redis layout);
`RateLimiter` enforces each tenant's requests a minute, tokens a minute and concurrent requests
in Redis, requests with token buckets and tokens with a sliding-window log of charges
(rate_limits.py, which also states what happens while Redis is down).
`connect` makes the client both use, with timeouts short enough that an outage is noticed fast.
"""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from mohawk_common.errors import ConfigError
from mohawk_common.tenancy.errors import TenancyError, TenancyUnavailable, TenantExists, TenantNotFound
from mohawk_common.tenancy.keys import hash_api_key, new_api_key
from mohawk_common.tenancy.rate_limits import (
    LimitState,
    RateDecision,
    RateLease,
    RateLimiter,
    Reason,
    completion_cap,
)
from mohawk_common.tenancy.store import TenantStore
from mohawk_common.tenancy.tenants import PRIORITIES, Priority, Tenant

CONNECT_TIMEOUT_S = 0.5
COMMAND_TIMEOUT_S = 1.0
POOL_SIZE = 128
POOL_WAIT_S = 5.0

__all__ = [
    "PRIORITIES",
    "LimitState",
    "Priority",
    "RateDecision",
    "RateLease",
    "RateLimiter",
    "Reason",
    "TenancyError",
    "TenancyUnavailable",
    "Tenant",
    "TenantExists",
    "TenantNotFound",
    "TenantStore",
    "completion_cap",
    "connect",
    "hash_api_key",
    "new_api_key",
    "read_password",
]


def read_password(path: Path | None) -> str | None:
    """The Redis password in file `path` (its first line), None without one; ConfigError when the
    file cannot be read or is empty."""
    if path is None:
        return None
    try:
        password = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the Redis password file {path}: {exc}") from exc
    if not password:
        raise ConfigError(f"the Redis password file {path} is empty")
    return password


def connect(url: str, password: str | None = None, tls_ca: Path | None = None) -> redis.Redis:
    """A client of the Redis at `url` (redis://host:port/db); connects on first use, gives up on
    an unreachable server within about a second and retries a broken connection once, at once.
    Its pool holds up to `POOL_SIZE` connections; a command finding them all busy waits up to
    `POOL_WAIT_S` for one (redis-py's own pool raises "Too many connections" at once instead,
    which a burst of 1,000 sessions on a busy gateway reached). `password`: the server's (`AUTH`),
    else the URL's own, if any; `tls_ca`: with a rediss:// URL, the CA the server's certificate
    must chain to (the bus CA), else the system's."""
    extra: dict[str, object] = {} if password is None else {"password": password}
    if tls_ca is not None and url.startswith("rediss://"):
        extra["ssl_ca_certs"] = str(tls_ca)
    pool = redis.BlockingConnectionPool.from_url(
        url,
        **extra,
        max_connections=POOL_SIZE,
        timeout=POOL_WAIT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=COMMAND_TIMEOUT_S,
        retry=Retry(NoBackoff(), 1),
    )
    return redis.Redis.from_pool(pool)
