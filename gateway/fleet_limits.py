"""A tenant's limits held once for the whole fleet of gateway processes, in Redis, without a Redis call on
most requests.

Without it, every gateway process keeps its own buckets, and N processes let a tenant through N times its
limit. Here the limits live in Redis and each process takes **allowances** from them in chunks, then
spends them locally (quota leasing, as Doorman and Envoy's global rate limiting with local quota do):

- Requests and tokens per minute are token buckets in Redis (a full minute's worth to start, refilled
  continuously, timed by Redis's own clock so hosts whose clocks differ share one minute). A process takes
  a chunk (1 % of the limit, at least 1) when its own allowance is used up, and admits from it until it is
  gone; what it has not used within a second it hands back, so a quiet process neither saves up a burst
  nor keeps a share another process could use.
  Tokens are known only when a request ends: they are spent from the process's allowance, which may go
  below zero, and the debt is charged to Redis with the next chunk (or within a second).
- Requests in flight are places: Redis counts the places each gateway process holds, under a lease the
  process renews every third of it; a process reserves a chunk when it needs one and gives back what it
  does not use, so a gateway that dies frees its places within one lease.
- Every grant comes out of one Lua script, atomic across processes: together the processes never hold
  more than the limit, so the fleet admits a tenant's limit once. The price is that an allowance
  stranded in one process (at most a chunk) is not available to another for that second. A limit under
  100 has chunks of 1, so small limits are exact: every request asks Redis.
- A tenant with no limit set costs nothing at all.

Redis down, slow or refusing never fails a request: the gateway decides with its own per-process limits
(gateway/limits.py) and tries Redis again a few seconds later, logging each change and counting every
decision it took alone.
"""

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway import contract
from gateway.limits import Limits, refusal

log = logging.getLogger("gateway")
CHUNK_SHARE = 0.01  # of a limit, taken at once by a process
ALLOWANCE_SECONDS = 1.0  # an allowance not spent within this is handed back

# A bucket in Redis: its level refilled up to ``cap`` per minute since it was last written, less ``debt``
# (tokens spent past an allowance; negative: an allowance handed back unused), never above ``cap``.
_BUCKET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function settle(key, cap, debt)
  local b = redis.call('HMGET', key, 'level', 'at')
  local level = tonumber(b[1]) or cap
  local at = tonumber(b[2]) or now
  return math.min(cap, math.min(cap, level + math.max(0, now - at) * cap / 60) - debt)
end
local function store(key, level)
  redis.call('HSET', key, 'level', level, 'at', now)
  redis.call('EXPIRE', key, 120)
end
"""
# KEYS: tokens bucket, requests bucket, places held (hash: process → count), leases (zset: process →
# until). ARGV: tokens/min, tokens debt, tokens wanted, requests/min, requests debt, requests wanted,
# places limit, places wanted, process, lease seconds. Returns the grants: {tokens, requests, places}.
ADMIT = (
    _BUCKET
    + """
local function take(key, cap, debt, want)
  if cap <= 0 or (want <= 0 and debt == 0) then return 0 end
  local level = settle(key, cap, debt)
  local grant = 0
  if level >= 1 then grant = math.min(want, math.floor(level)) end
  store(key, level - grant)
  return grant
end
local function reserve(held, leases, limit, want, process, lease)
  if limit <= 0 or want <= 0 then return 0 end
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now)) do
    redis.call('HDEL', held, gone)
    redis.call('ZREM', leases, gone)
  end
  local total = 0
  for _, n in ipairs(redis.call('HVALS', held)) do total = total + tonumber(n) end
  -- Kept alive by every call, granting or not: places in use stay counted however long they run.
  redis.call('EXPIRE', held, math.ceil(lease * 2) + 1)
  redis.call('EXPIRE', leases, math.ceil(lease * 2) + 1)
  local grant = math.min(want, limit - total)
  if grant <= 0 then return 0 end
  redis.call('HINCRBY', held, process, grant)
  redis.call('ZADD', leases, now + lease, process)
  return grant
end
local n = {}
for i = 1, 8 do n[i] = tonumber(ARGV[i]) end
return {
  take(KEYS[1], n[1], n[2], n[3]),
  take(KEYS[2], n[4], n[5], n[6]),
  reserve(KEYS[3], KEYS[4], n[7], n[8], ARGV[9], tonumber(ARGV[10])),
}
"""
)
# KEYS: places held, leases. ARGV: process, the places it keeps (absolute, so a reply lost to a timeout
# is corrected by the next call), lease seconds (renews what it keeps).
HOLD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local kept, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
if kept <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], kept)
  redis.call('ZADD', KEYS[2], now + lease, ARGV[1])
  redis.call('EXPIRE', KEYS[1], math.ceil(lease * 2) + 1)
  redis.call('EXPIRE', KEYS[2], math.ceil(lease * 2) + 1)
end
return kept
"""
# KEYS: a bucket. ARGV: its limit per minute, the debt (tokens spent past an allowance, or negative: an
# allowance handed back).
CHARGE = (
    _BUCKET
    + """
store(KEYS[1], settle(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])))
return 0
"""
)


def keys(tenant: str) -> tuple[str, str, str, str]:
    """The tenant's keys; ``{tenant}`` is a hash tag, so a Redis Cluster keeps them in one slot."""
    return tuple(f"gw:{{{tenant}}}:{part}" for part in ("tokens", "requests", "places", "leases"))  # type: ignore[return-value]


def chunk(limit: int) -> int:
    return max(1, math.ceil(limit * CHUNK_SHARE))


def _wants(have: "Allowance", limits: contract.TenantLimits) -> tuple[int, int, int]:
    """The chunks to ask Redis for: tokens, requests, places; 0 where the allowance still covers it."""
    tpm, rpm = limits.get("tokens_per_minute", 0), limits.get("requests_per_minute", 0)
    places = limits.get("concurrent_requests", 0)
    return (
        chunk(tpm) if tpm and have.tokens <= 0 else 0,
        chunk(rpm) if rpm and have.requests < 1 else 0,
        chunk(places) if places and have.in_flight >= have.places else 0,
    )


def surplus(spare: int, size: int) -> int:
    """How many spare places to give back: all of them under a small limit (exact: another process may
    need the one place left), else down to one chunk once two have gathered (no call per request)."""
    if spare <= 0:
        return 0
    if size == 1:
        return spare
    return spare - size if spare >= 2 * size else 0


class RedisTimeout(RedisError):
    """Redis took too long (or was found down) for a decision that must not wait: decided locally."""


@dataclass
class Allowance:
    """What this process may still spend of one tenant's limits, taken from Redis."""

    requests: float = 0.0
    tokens: float = 0.0  # below zero: tokens spent that Redis has not been charged for yet
    # Allowances not spent in time, to hand back to Redis with the next exchange (or within a second).
    unused_requests: float = 0.0
    unused_tokens: float = 0.0
    requests_per_minute: int = 0  # the limits they count against (to hand back or charge)
    tokens_per_minute: int = 0
    taken_at: float = 0.0
    places: int = 0  # reserved in Redis
    in_flight: int = 0  # of those, used by requests running here
    empty_until: float = 0.0  # Redis had nothing to grant: refuse here until a chunk may have refilled
    # One Redis exchange per tenant at a time: requests arriving meanwhile wait for its grant instead of
    # each taking a chunk, and what is given back is counted against what is really held.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class Ticket:
    """An admitted request: where its place is held (Redis or this process), released by ``finish``."""

    tenant: str
    limits: contract.TenantLimits
    shared: bool


@dataclass
class FleetLimits:
    """The gateway's limiter: shared through Redis when ``url`` names one, else this process's own."""

    url: str = ""
    lease_seconds: float = 60.0
    retry_seconds: float = 5.0  # after Redis failed, this process decides alone this long
    timeout_seconds: float = 0.25
    local: Limits = field(default_factory=Limits)
    allowances: dict[str, Allowance] = field(default_factory=dict)
    counts: dict[str, int] = field(
        default_factory=lambda: {
            "shared_decisions": 0,
            "local_decisions": 0,
            "redis_calls": 0,
            "redis_errors": 0,
        }
    )
    down_until: float = 0.0
    process: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{id(object())}")

    def __post_init__(self) -> None:
        if not self.url:
            self.down_until = float("inf")  # no Redis: every decision is this process's
            return
        self.redis = Redis.from_url(
            self.url,
            socket_timeout=self.timeout_seconds,
            socket_connect_timeout=self.timeout_seconds,
            retry=Retry(NoBackoff(), 0),  # a slow Redis must not make every request slower: fall back
        )
        self._admit = self.redis.register_script(ADMIT)
        self._hold = self.redis.register_script(HOLD)
        self._charge = self.redis.register_script(CHARGE)

    @property
    def redis_up(self) -> bool:
        return time.monotonic() >= self.down_until

    async def admit(
        self, tenant: str, limits: contract.TenantLimits, request_id: str = ""
    ) -> tuple[str, Ticket | None]:
        """'' and a ticket when the request may go, else which limit it hit. A tenant without limits
        gets no ticket and costs nothing."""
        if not limits:
            return "", None
        if self.redis_up:
            try:
                refused = await self._admit_shared(tenant, limits)
            except (RedisError, OSError) as exc:
                self._lost(exc)
            else:
                self.counts["shared_decisions"] += 1
                return refused, None if refused else Ticket(tenant, limits, shared=True)
        self.counts["local_decisions"] += 1
        refused = self.local.admit(tenant, limits)
        return refused, None if refused else Ticket(tenant, limits, shared=False)

    async def _admit_shared(self, tenant: str, limits: contract.TenantLimits) -> str:
        have = self._allowance(tenant)
        tpm, rpm = limits.get("tokens_per_minute", 0), limits.get("requests_per_minute", 0)
        places = limits.get("concurrent_requests", 0)
        if any(_wants(have, limits)) and time.monotonic() >= have.empty_until:
            async with self._exchange(have):
                # Again under the lock (the exchange someone else waited for may have brought it), and once
                # more after an exchange: requests that ended meanwhile may have spent what it brought.
                for _ in range(2):
                    wants = _wants(have, limits)
                    if not any(wants) or time.monotonic() < have.empty_until:
                        break
                    await self._take(tenant, limits, have, wants)
        # The same order as the per-process limiter: tokens left, a place free, a request left.
        if tpm and have.tokens <= 0:
            return refusal("tokens", limits)
        if places and have.in_flight >= have.places:
            return refusal("concurrent", limits)
        if rpm and have.requests < 1:
            return refusal("requests", limits)
        have.requests -= 1 if rpm else 0
        have.in_flight += 1 if places else 0
        return ""

    async def _take(
        self, tenant: str, limits: contract.TenantLimits, have: Allowance, wants: tuple[int, int, int]
    ) -> None:
        tpm, rpm = limits.get("tokens_per_minute", 0), limits.get("requests_per_minute", 0)
        have.tokens_per_minute, have.requests_per_minute = tpm, rpm
        # What this exchange settles, as it stands now: the allowance keeps moving while it is away.
        charged = max(0.0, -have.tokens) if tpm else 0.0
        back_tokens = have.unused_tokens if tpm else 0.0
        back_requests = have.unused_requests if rpm else 0.0
        args: list[str | int | float] = [tpm, charged - back_tokens, wants[0], rpm, -back_requests, wants[1]]
        args += [limits.get("concurrent_requests", 0), wants[2], self.process, self.lease_seconds]
        self.counts["redis_calls"] += 1
        tokens, requests, places = await self._admit(keys=keys(tenant), args=args)
        have.tokens += charged + int(tokens)
        have.unused_tokens -= back_tokens
        have.unused_requests -= back_requests
        have.requests += int(requests)
        have.places += int(places)
        have.taken_at = time.monotonic()
        # An empty bucket refills a chunk in 60 × chunk ÷ limit seconds; until then (at most a second)
        # refusals are decided here, so a tenant over its limit does not flood Redis with calls.
        waits = [
            60 * want / limit
            for want, granted, limit in (
                (wants[0], tokens, limits.get("tokens_per_minute", 0)),
                (wants[1], requests, limits.get("requests_per_minute", 0)),
            )
            if want and not granted and limit
        ]
        if waits:
            have.empty_until = have.taken_at + min(ALLOWANCE_SECONDS, max(waits))

    def _allowance(self, tenant: str) -> Allowance:
        have = self.allowances.setdefault(tenant, Allowance())
        if time.monotonic() - have.taken_at > ALLOWANCE_SECONDS:
            # Not spent in time: handed back (a quiet process must not save up a burst, nor keep a share
            # that other processes could use).
            have.unused_requests += max(have.requests, 0.0)
            have.unused_tokens += max(have.tokens, 0.0)
            have.requests, have.tokens = 0.0, min(have.tokens, 0.0)
        return have

    async def finish(self, ticket: Ticket | None, tokens: int) -> None:
        if ticket is None:
            return
        if not ticket.shared:
            self.local.finish(ticket.tenant, ticket.limits, tokens)
            return
        have = self.allowances.setdefault(ticket.tenant, Allowance())
        # What this process knows is settled first, with no await: a finish cut short (the task cancelled)
        # has still freed its place and spent its tokens here; Redis learns by the next pass at the latest.
        places, per_minute = (
            ticket.limits.get("concurrent_requests", 0),
            ticket.limits.get("tokens_per_minute", 0),
        )
        if places:
            have.in_flight = max(0, have.in_flight - 1)
        if per_minute and tokens:
            have.tokens -= tokens
            have.tokens_per_minute = per_minute
        if not self.redis_up:
            return
        try:
            if per_minute and have.tokens <= -chunk(per_minute):  # past a chunk: charged now, not in a second
                async with self._exchange(have):
                    await self._charge_debt(ticket.tenant, have)
            if places and surplus(have.places - have.in_flight, chunk(places)):
                async with self._exchange(have):
                    await self._give_back(
                        ticket.tenant, have, surplus(have.places - have.in_flight, chunk(places))
                    )
        except (RedisError, OSError) as exc:
            self._lost(exc)  # kept here: the next pass settles it

    async def _give_back(self, tenant: str, have: Allowance, places: int) -> None:
        """Return unused places, so other processes may have them."""
        if places > 0:
            await self._keep(tenant, have, have.places - places)

    async def _keep(self, tenant: str, have: Allowance, kept: int) -> None:
        """Hold ``kept`` places in Redis from now on. Counted here before the call, so no request admitted
        meanwhile takes a place another process may already have; restored if the call fails."""
        _, _, held, leases = keys(tenant)
        before, have.places = have.places, kept
        try:
            self.counts["redis_calls"] += 1
            await self._hold(keys=[held, leases], args=[self.process, kept, self.lease_seconds])
        except BaseException:
            have.places = before
            raise

    @contextlib.asynccontextmanager
    async def _exchange(self, have: Allowance) -> AsyncIterator[None]:
        """The tenant's lock for one Redis exchange, waited for no longer than a Redis call may take (a
        slow Redis must not queue requests behind one another), and only while Redis is up."""
        try:
            await asyncio.wait_for(have.lock.acquire(), self.timeout_seconds * 2)
        except TimeoutError as exc:
            raise RedisTimeout("waited too long for this tenant's Redis exchange") from exc
        try:
            if not self.redis_up:
                raise RedisTimeout("Redis was found down meanwhile")
            yield
        finally:
            have.lock.release()

    async def renew_forever(self) -> None:
        """Every second (or third of a lease, if shorter): renew the places this process holds, give back
        the spare ones, and charge the tokens no allowance covered."""
        while self.url:
            await asyncio.sleep(min(ALLOWANCE_SECONDS, self.lease_seconds / 3))
            if not self.redis_up:
                continue
            try:
                await self.renew_once()
            except (RedisError, OSError) as exc:
                self._lost(exc)
            except Exception:  # the leases must keep being renewed whatever one pass ran into
                log.exception("renewing the gateway's shared limits failed")

    async def renew_once(self) -> None:
        for tenant, have in list(self.allowances.items()):
            async with self._exchange(have):
                if have.places:
                    # One call: the places in use kept (their lease renewed), every spare one given back;
                    # the absolute count also corrects a grant whose reply was lost to a timeout.
                    await self._keep(tenant, have, have.in_flight)
                self._allowance(tenant)  # hands back what was not spent in time
                await self._settle(tenant, have)

    async def _charge_debt(self, tenant: str, have: Allowance) -> None:
        """Charge Redis for the tokens spent here beyond the allowance (kept as debt if Redis fails)."""
        debt = max(0.0, -have.tokens)
        if have.tokens_per_minute and debt:
            self.counts["redis_calls"] += 1
            await self._charge(keys=[keys(tenant)[0]], args=[have.tokens_per_minute, debt])
            have.tokens += debt  # what was spent meanwhile stays, for the next charge

    async def _settle(self, tenant: str, have: Allowance) -> None:
        """Charge token debts and hand back unused allowances (the background pass, once a second)."""
        tokens_key, requests_key, _, _ = keys(tenant)
        charged, back = max(0.0, -have.tokens), have.unused_tokens
        if have.tokens_per_minute and (charged or back):
            self.counts["redis_calls"] += 1
            await self._charge(keys=[tokens_key], args=[have.tokens_per_minute, charged - back])
            have.tokens += charged
            have.unused_tokens -= back
        back = have.unused_requests
        if have.requests_per_minute and back:
            self.counts["redis_calls"] += 1
            await self._charge(keys=[requests_key], args=[have.requests_per_minute, -back])
            have.unused_requests -= back

    def _lost(self, exc: BaseException) -> None:
        self.counts["redis_errors"] += 1
        if self.redis_up:
            log.warning(
                "Redis unreachable (%s): limits are per gateway process for the next %.0f s",
                exc or type(exc).__name__,
                self.retry_seconds,
            )
        self.down_until = time.monotonic() + self.retry_seconds

    def stats(self) -> dict[str, int]:
        return {**self.counts, "redis_configured": int(bool(self.url)), "redis_up": int(self.redis_up)}

    async def close(self) -> None:
        if self.url:
            with contextlib.suppress(RedisError, OSError):
                await self.redis.aclose()
