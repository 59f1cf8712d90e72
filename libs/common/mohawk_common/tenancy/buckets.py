"""The rules of rate limits, in Redis (Lua, shared by every gateway) and in this process.

Design. Requests a minute are a token bucket: capacity rpm, full when untouched, refilled at rpm/60
a second; a request takes 1. Tokens a minute are a sliding-window log, because a bucket lets a
tenant through twice its tpm in its first minute (the full bucket, then a minute's refill): every
admitted request records its charge, (when, request id, tokens), and a request asking `want`
tokens is admitted only if the charges of the last minute plus `want` stay within tpm, so no
minute, the first included, holds more than tpm in charges. A request that sets no completion
limit is admitted for a floor and then `extend`ed: its charge grows to its cap or to what the
window has left, whichever is less, so its completion is bounded by the tenant's remaining budget.
When a request ends its charge is settled to what it used: less gives the rest back to the window,
more overdraws it (the sum may pass tpm, and the next request waits until enough charges lapse);
a request that ran so long its charge lapsed is charged what it used beyond it, now. A refused
request learns when the oldest charges will have lapsed enough to admit it. With a concurrency
limit, fewer than max_concurrency requests may hold a slot; slots live in a sorted set scored by
when they lapse, so a crashed gateway's slots come back on their own.

In Redis a tenant's charges are two records: a hash of request id -> tokens plus `total`, their
running sum (so admission costs O(requests lapsing), not O(requests in the window)), and a sorted
set of request ids scored by when they were charged (ms, Redis's clock). Deleting the hash alone
resets the tenant's tokens: a logged id with no amount counts as 0. Each check and change is one
Lua script, atomic against every other gateway; a refusal takes nothing. `LocalBuckets` is the
same rule on this process's clock, for when Redis cannot be reached. The minute is a parameter
(`minute_s`) so that tests can run the rules in seconds. `Outcome` and `Grant` are what either
answers; the wait, headers and reasons are computed from them once, in `rate_limits.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mohawk_common.tenancy.tenants import Tenant

MINUTE_S = 60.0
# Why a request was refused, as the scripts number it.
ADMITTED, NO_REQUESTS, NO_TOKENS, NO_SLOT = 0, 1, 2, 3

# Each script sets `minute` (ms: a bucket's time to fill, a charge's time in the window) first.
_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
-- What a bucket of `capacity` (full after one minute) holds now.
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
-- Drop the charges older than a minute from the hash `charges` and the log; what is left in total.
local function spent(charges, log)
  local total = tonumber(redis.call('HGET', charges, 'total') or 0)
  local lapsed = redis.call('ZRANGEBYSCORE', log, '-inf', now - minute)
  for _, id in ipairs(lapsed) do
    total = total - tonumber(redis.call('HGET', charges, id) or 0)
    redis.call('HDEL', charges, id)
  end
  if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', log, '-inf', now - minute) end
  return total
end
-- Set request `id`'s charge to `tokens` (logged now if it is new) and the total; keep both records
-- a minute from now, when every charge in them has lapsed.
local function charge(charges, log, id, tokens, total)
  if redis.call('HEXISTS', charges, id) == 0 then redis.call('ZADD', log, now, id) end
  redis.call('HSET', charges, id, tokens, 'total', total)
  redis.call('PEXPIRE', charges, math.ceil(minute) + 1000)
  redis.call('PEXPIRE', log, math.ceil(minute) + 1000)
end
-- ms until every charge has lapsed.
local function reset(log)
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #newest == 0 then return 0 end
  return math.max(0, tonumber(newest[2]) + minute - now)
end
-- ms until `want` more tokens fit within `tpm`, as the oldest charges lapse.
local function wait(charges, log, total, want, tpm)
  local over = total + want - tpm
  if over <= 0 then return 0 end
  local logged = redis.call('ZRANGE', log, 0, -1, 'WITHSCORES')
  for i = 1, #logged, 2 do
    over = over - tonumber(redis.call('HGET', charges, logged[i]) or 0)
    if over <= 0 then return math.max(0, tonumber(logged[i + 1]) + minute - now) end
  end
  return reset(log)
end
"""

# KEYS: requests bucket, token charges, token log, slots set.
# ARGV: rpm, tpm, max concurrency (0: no such limit), tokens asked, request id, slot lifetime (ms),
# minute (ms). Returns {why refused (0: admitted), requests left, tokens left, ms until the tokens
# asked fit, ms until every charge lapses}, as strings.
ACQUIRE_SCRIPT = (
    "local minute = tonumber(ARGV[7])\n"
    + _PRELUDE
    + """
local rpm, tpm, slots = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local want, id, lifetime = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local requests, total, busy = 0, 0, 0
if rpm > 0 then requests = level(KEYS[1], rpm) end
if tpm > 0 then total = spent(KEYS[2], KEYS[3]) end
if slots > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  busy = redis.call('ZCARD', KEYS[4])
end
local refused = 0
if rpm > 0 and requests < 1 then refused = 1
elseif tpm > 0 and total + want > tpm then refused = 2
elseif slots > 0 and busy >= slots then refused = 3
end
if refused == 0 then
  if rpm > 0 then requests = requests - 1; save(KEYS[1], rpm, requests) end
  if tpm > 0 then total = total + want; charge(KEYS[2], KEYS[3], id, want, total) end
  if slots > 0 then
    redis.call('ZADD', KEYS[4], now + lifetime, id)
    redis.call('PEXPIRE', KEYS[4], lifetime)
  end
end
local waited, full = 0, 0
if tpm > 0 then
  if refused == 2 then waited = wait(KEYS[2], KEYS[3], total, want, tpm) end
  full = reset(KEYS[3])
end
return {refused, tostring(requests), tostring(tpm - total), tostring(waited), tostring(full)}
"""
)

# KEYS: token charges, token log.  ARGV: tpm, request id, tokens charged, most to charge, minute (ms).
# Returns {tokens now charged, tokens left, ms until every charge lapses}, as strings.
EXTEND_SCRIPT = (
    "local minute = tonumber(ARGV[5])\n"
    + _PRELUDE
    + """
local tpm, id, charged, most = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local total = spent(KEYS[1], KEYS[2])
local amount = redis.call('HGET', KEYS[1], id)
if amount then
  charged = tonumber(amount)
  local more = math.min(most - charged, tpm - total)
  if more > 0 then
    charged, total = charged + more, total + more
    charge(KEYS[1], KEYS[2], id, charged, total)
  end
end
return {tostring(charged), tostring(tpm - total), tostring(reset(KEYS[2]))}
"""
)

# KEYS: token charges, token log, slots set.  ARGV: tpm (0: no such limit), request id, tokens
# charged, tokens used, minute (ms).
RELEASE_SCRIPT = (
    "local minute = tonumber(ARGV[5])\n"
    + _PRELUDE
    + """
redis.call('ZREM', KEYS[3], ARGV[2])
local tpm, id, charged, used = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if tpm > 0 then
  local total = spent(KEYS[1], KEYS[2])
  local amount = redis.call('HGET', KEYS[1], id)
  if amount and tonumber(amount) ~= used then
    charge(KEYS[1], KEYS[2], id, used, total - tonumber(amount) + used)
  elseif not amount and used > charged then  -- its charge lapsed while it ran: the rest, now
    charge(KEYS[1], KEYS[2], id, used - charged, total + used - charged)
  end
end
return 1
"""
)


@dataclass(frozen=True)
class Outcome:
    """What the rules said of a request: why it was refused (ADMITTED if it was not), the requests
    left in the bucket and the tokens left in the window after it (0 where the tenant has no such
    limit; tokens below 0 after an overrun), when the tokens asked would fit (0 when they do) and
    when every charge in the window will have lapsed."""

    refused: int
    requests: float
    tokens: float
    tokens_wait_s: float = 0.0
    tokens_reset_s: float = 0.0

    @staticmethod
    def from_script(reply: list[bytes | int]) -> Outcome:
        requests, tokens, wait_ms, reset_ms = (float(value) for value in reply[1:5])
        return Outcome(int(reply[0]), requests, tokens, wait_ms / 1000, reset_ms / 1000)


@dataclass(frozen=True)
class Grant:
    """What `extend` left a request: its charge now, the tokens left in the window, and when every
    charge in it will have lapsed."""

    charged: int
    tokens: float
    tokens_reset_s: float

    @staticmethod
    def from_script(reply: list[bytes]) -> Grant:
        return Grant(round(float(reply[0])), float(reply[1]), float(reply[2]) / 1000)


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


@dataclass(frozen=True)
class _Charge:
    at: float
    tokens: int


@dataclass
class _TokenLog:
    """One tenant's charges of the last minute, oldest first (the Lua scripts' rule)."""

    minute_s: float
    charges: dict[str, _Charge] = field(default_factory=dict)  # request id -> charge, in time order
    total: int = 0

    def spent(self, now: float) -> int:
        """Drop the charges older than a minute; what the rest add up to."""
        for request_id, charge in list(self.charges.items()):
            if charge.at > now - self.minute_s:
                break
            del self.charges[request_id]
            self.total -= charge.tokens
        return self.total

    def charge(self, request_id: str, tokens: int, now: float) -> None:
        """Set the request's charge to `tokens`, logged now if it has none."""
        old = self.charges.get(request_id)
        self.charges[request_id] = _Charge(now if old is None else old.at, tokens)
        self.total += tokens - (0 if old is None else old.tokens)

    def wait_s(self, now: float, want: int, tpm: int) -> float:
        """Seconds until `want` more tokens fit within `tpm`, as the oldest charges lapse."""
        over = self.total + want - tpm
        for charge in self.charges.values():
            if over <= 0:
                break
            over -= charge.tokens
            if over <= 0:
                return max(0.0, charge.at + self.minute_s - now)
        return 0.0 if over <= 0 else self.reset_s(now)

    def reset_s(self, now: float) -> float:
        """Seconds until every charge has lapsed."""
        newest = next(reversed(self.charges.values()), None)
        return 0.0 if newest is None else max(0.0, newest.at + self.minute_s - now)


@dataclass
class LocalBuckets:
    """The buckets, token logs and slots of every tenant, in this process only."""

    clock: Callable[[], float]
    slot_lifetime_s: float
    minute_s: float = MINUTE_S
    _buckets: dict[str, _Bucket] = field(default_factory=dict)  # tenant -> requests bucket
    _logs: dict[str, _TokenLog] = field(default_factory=dict)  # tenant -> token log
    _slots: dict[str, dict[str, float]] = field(default_factory=dict)  # tenant -> request -> lapses at

    def acquire(self, tenant: Tenant, want: int, request_id: str) -> Outcome:
        now = self.clock()
        requests = self._requests(tenant, now)
        log = self._log(tenant)
        spent = log.spent(now) if log is not None else 0
        slots = self._slots.setdefault(tenant.name, {})
        for lapsed in [r for r, until in slots.items() if until <= now]:
            del slots[lapsed]
        refused = ADMITTED
        if tenant.rpm is not None and requests < 1:
            refused = NO_REQUESTS
        elif tenant.tpm is not None and spent + want > tenant.tpm:
            refused = NO_TOKENS
        elif tenant.max_concurrency is not None and len(slots) >= tenant.max_concurrency:
            refused = NO_SLOT
        if refused == ADMITTED:
            if tenant.rpm is not None:
                requests = self._buckets[tenant.name].level = requests - 1
            if log is not None:
                log.charge(request_id, want, now)
            if tenant.max_concurrency is not None:
                slots[request_id] = now + self.slot_lifetime_s
        if log is None or tenant.tpm is None:
            return Outcome(refused, requests, 0.0)
        wait_s = log.wait_s(now, want, tenant.tpm) if refused == NO_TOKENS else 0.0
        return Outcome(refused, requests, tenant.tpm - log.total, wait_s, log.reset_s(now))

    def extend(self, tenant: Tenant, request_id: str, charged: int, most: int) -> Grant:
        """Grow the request's charge towards `most`, within what the window has left."""
        now = self.clock()
        log = self._log(tenant)
        if log is None or tenant.tpm is None:
            return Grant(charged, 0.0, 0.0)
        spent = log.spent(now)
        if request_id in log.charges:
            charged = log.charges[request_id].tokens
            more = min(most - charged, tenant.tpm - spent)
            if more > 0:
                charged += more
                log.charge(request_id, charged, now)
        return Grant(charged, tenant.tpm - log.total, log.reset_s(now))

    def release(self, tenant: Tenant, request_id: str, charged: int, used: int) -> None:
        """Free the request's slot and settle its charge to the tokens it `used`."""
        self._slots.get(tenant.name, {}).pop(request_id, None)
        log = self._log(tenant)
        if log is None:
            return
        now = self.clock()
        log.spent(now)
        if request_id in log.charges:
            log.charge(request_id, used, now)
        elif used > charged:  # its charge lapsed while it ran: the rest, now
            log.charge(request_id, used - charged, now)

    def _requests(self, tenant: Tenant, now: float) -> float:
        if tenant.rpm is None:
            self._buckets.pop(tenant.name, None)
            return 0.0
        bucket = self._buckets.setdefault(tenant.name, _Bucket(tenant.rpm, tenant.rpm, now))
        return bucket.refill(tenant.rpm, now, self.minute_s)

    def _log(self, tenant: Tenant) -> _TokenLog | None:
        if tenant.tpm is None:
            self._logs.pop(tenant.name, None)
            return None
        return self._logs.setdefault(tenant.name, _TokenLog(self.minute_s))
