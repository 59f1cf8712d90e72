"""The token-bucket rule of rate limits, in Redis (Lua, shared by every gateway) and in this process.

Design. A bucket of capacity C (rpm requests, or tpm tokens) is full when untouched and refills at
C/60 a second, continuously; a request takes 1 from the requests bucket and its charged tokens from
the tokens bucket, and is admitted only if every bucket holds enough and, with a concurrency limit,
fewer than max_concurrency requests hold a slot. When a request ends, its tokens are settled: the
part of the up-front charge it did not use comes back (never past full), and what it used beyond
that charge is taken too, so the bucket may go below zero and the next request waits until it has
refilled. The minute is a parameter (`minute_s`) so that tests can run the rule in seconds.
Slots live in a sorted set scored by when they lapse, so a crashed gateway's slots come back on
their own. The check and the taking are one Lua script run by Redis, atomic against every other
gateway, on Redis's own clock; a refusal takes nothing. `LocalBuckets` is the same rule on this
process's clock, for when Redis cannot be reached; `Outcome` is what either answers. The wait
before a refused request could pass, the headers and the reasons are computed from an Outcome once,
in `rate_limits.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mohawk_common.tenancy.tenants import Tenant

MINUTE_S = 60.0
# Why a request was refused, as the scripts number it.
ADMITTED, NO_REQUESTS, NO_TOKENS, NO_SLOT = 0, 1, 2, 3

# Each script sets `minute` (ms, the time an empty bucket takes to fill) before this.
_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
-- What a bucket of `capacity` (full after one minute) holds now; below zero after an overrun.
local function level(key, capacity)
  local saved = redis.call('HMGET', key, 'level', 'ts')
  if not saved[1] then return capacity end
  return math.min(capacity, tonumber(saved[1]) + (now - tonumber(saved[2])) * capacity / minute)
end
-- Keep `left` in the bucket, until it would be full again (a missing bucket is a full one).
local function save(key, capacity, left)
  redis.call('HSET', key, 'level', left, 'ts', now)
  redis.call('PEXPIRE', key, math.ceil((capacity - left) * minute / capacity) + 1000)
end
"""

# KEYS: requests bucket, tokens bucket, slots set.
# ARGV: rpm, tpm, max concurrency (0: no such limit), tokens asked, request id, slot lifetime (ms),
# minute (ms). Returns {why refused (0: admitted), requests left, tokens left}, levels as strings.
ACQUIRE_SCRIPT = (
    "local minute = tonumber(ARGV[7])\n"
    + _PRELUDE
    + """
local rpm, tpm, slots = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local want, lifetime = tonumber(ARGV[4]), tonumber(ARGV[6])
local requests, tokens, busy = 0, 0, 0
if rpm > 0 then requests = level(KEYS[1], rpm) end
if tpm > 0 then tokens = level(KEYS[2], tpm) end
if slots > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  busy = redis.call('ZCARD', KEYS[3])
end
local refused = 0
if rpm > 0 and requests < 1 then refused = 1
elseif tpm > 0 and tokens < want then refused = 2
elseif slots > 0 and busy >= slots then refused = 3
end
if refused == 0 then
  if rpm > 0 then requests = requests - 1; save(KEYS[1], rpm, requests) end
  if tpm > 0 then tokens = tokens - want; save(KEYS[2], tpm, tokens) end
  if slots > 0 then
    redis.call('ZADD', KEYS[3], now + lifetime, ARGV[5])
    redis.call('PEXPIRE', KEYS[3], lifetime)
  end
end
return {refused, tostring(requests), tostring(tokens)}
"""
)

# KEYS: tokens bucket, slots set.  ARGV: tpm (0: no such limit), tokens to give back (negative: to
# take, for a request that used more than it was charged), request id, minute (ms).
RELEASE_SCRIPT = (
    "local minute = tonumber(ARGV[4])\n"
    + _PRELUDE
    + """
redis.call('ZREM', KEYS[2], ARGV[3])
local tpm, back = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm > 0 and back ~= 0 and (back < 0 or redis.call('EXISTS', KEYS[1]) == 1) then
  save(KEYS[1], tpm, math.min(tpm, level(KEYS[1], tpm) + back))
end
return 1
"""
)


@dataclass(frozen=True)
class Outcome:
    """What the buckets said: why a request was refused (ADMITTED if it was not), and what the
    requests and tokens buckets hold after it (0 where the tenant has no such limit)."""

    refused: int
    requests: float
    tokens: float

    @staticmethod
    def from_script(reply: list[bytes | int]) -> Outcome:
        return Outcome(int(reply[0]), float(reply[1]), float(reply[2]))


@dataclass
class _Bucket:
    capacity: float
    level: float
    at: float

    def refill(self, capacity: float, now: float, minute_s: float) -> float:
        self.capacity = capacity  # the tenant's limit may have changed since
        self.level = min(capacity, self.level + (now - self.at) * capacity / minute_s)
        self.at = now
        return self.level


@dataclass
class LocalBuckets:
    """The buckets and slots of every tenant, in this process only."""

    clock: Callable[[], float]
    slot_lifetime_s: float
    minute_s: float = MINUTE_S
    _buckets: dict[tuple[str, str], _Bucket] = field(default_factory=dict)
    _slots: dict[str, dict[str, float]] = field(default_factory=dict)  # tenant -> request -> lapses at

    def acquire(self, tenant: Tenant, want: int, request_id: str) -> Outcome:
        now = self.clock()
        requests = self._level(tenant.name, "requests", tenant.rpm, now)
        tokens = self._level(tenant.name, "tokens", tenant.tpm, now)
        slots = self._slots.setdefault(tenant.name, {})
        for lapsed in [r for r, until in slots.items() if until <= now]:
            del slots[lapsed]
        refused = ADMITTED
        if tenant.rpm is not None and requests < 1:
            refused = NO_REQUESTS
        elif tenant.tpm is not None and tokens < want:
            refused = NO_TOKENS
        elif tenant.max_concurrency is not None and len(slots) >= tenant.max_concurrency:
            refused = NO_SLOT
        if refused == ADMITTED:
            requests = self._take(tenant.name, "requests", 1)
            tokens = self._take(tenant.name, "tokens", want)
            if tenant.max_concurrency is not None:
                slots[request_id] = now + self.slot_lifetime_s
        return Outcome(refused, requests, tokens)

    def release(self, tenant: Tenant, request_id: str, back: int) -> None:
        """Free the request's slot and settle its tokens: give `back` back, or take -`back` more."""
        self._slots.get(tenant.name, {}).pop(request_id, None)
        if tenant.tpm is not None and back != 0:
            self._level(tenant.name, "tokens", tenant.tpm, self.clock())
            self._take(tenant.name, "tokens", -back)

    def _level(self, name: str, kind: str, capacity: int | None, now: float) -> float:
        if capacity is None:
            self._buckets.pop((name, kind), None)
            return 0.0
        bucket = self._buckets.setdefault((name, kind), _Bucket(capacity, capacity, now))
        return bucket.refill(capacity, now, self.minute_s)

    def _take(self, name: str, kind: str, amount: int) -> float:
        bucket = self._buckets.get((name, kind))
        if bucket is None:
            return 0.0
        bucket.level = min(bucket.capacity, bucket.level - amount)
        return bucket.level
