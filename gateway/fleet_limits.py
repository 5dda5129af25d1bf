"""A tenant's limits held once for the whole fleet of gateway processes, in Redis.

Without it, every gateway process keeps its own buckets, and N processes let a tenant through N times its
limit. Here each request's admission is one Lua script in Redis, atomic across processes and hosts:

- requests and tokens per minute are token buckets (the same shape as the per-process ones: a full
  minute's worth to start, refilled continuously), timed by Redis's own clock, so gateway hosts whose
  clocks differ still share one minute;
- requests in flight are a sorted set of request ids per tenant, each with a lease: a gateway renews the
  leases of its requests while they run and removes them when they end, so a gateway that dies frees its
  places within one lease;
- a tenant with no limit set costs no Redis call at all.

Redis down, slow or refusing never fails a request: the gateway decides with its own per-process limits
(gateway/limits.py) and tries Redis again a few seconds later, logging each change and counting every
decision it took alone.
"""

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway import contract
from gateway.limits import Limits, refusal

log = logging.getLogger("gateway")
KINDS = {1: "tokens", 2: "requests", 3: "concurrent"}

_LEVEL = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function level(key, cap)
  local b = redis.call('HMGET', key, 'level', 'at')
  local l = tonumber(b[1]) or cap
  local at = tonumber(b[2]) or now
  return math.min(cap, l + math.max(0, now - at) * cap / 60)
end
"""
# KEYS: tokens bucket, requests bucket, in-flight set. ARGV: tokens/min, requests/min, places (0: no
# limit), request id, lease seconds. 0 admits; 1, 2, 3 name the limit hit (tokens, requests, in flight).
ADMIT = (
    _LEVEL
    + """
local tpm, rpm, places = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if tpm > 0 and level(KEYS[1], tpm) <= 0 then return 1 end
if places > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= places then return 3 end
end
if rpm > 0 then
  local l = level(KEYS[2], rpm)
  if l < 1 then return 2 end
  redis.call('HSET', KEYS[2], 'level', l - 1, 'at', now)
  redis.call('EXPIRE', KEYS[2], 120)
end
if places > 0 then
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[4])
  redis.call('EXPIRE', KEYS[3], math.ceil(tonumber(ARGV[5]) * 2) + 1)  -- forgets a tenant gone quiet
end
return 0
"""
)
# KEYS: tokens bucket, in-flight set. ARGV: tokens/min (0: none), tokens spent, request id.
FINISH = (
    _LEVEL
    + """
local tpm, spent = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm > 0 and spent > 0 then
  redis.call('HSET', KEYS[1], 'level', level(KEYS[1], tpm) - spent, 'at', now)
  redis.call('EXPIRE', KEYS[1], 120)
end
redis.call('ZREM', KEYS[2], ARGV[3])
return 0
"""
)
# KEYS: one tenant's in-flight set. ARGV: lease seconds, then the request ids still running here.
RENEW = """
local t = redis.call('TIME')
local until_ = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', until_, ARGV[i]) end
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1]) * 2) + 1)
return 0
"""


def keys(tenant: str) -> tuple[str, str, str]:
    """The tenant's keys; ``{tenant}`` is a hash tag, so a Redis Cluster keeps all three in one slot."""
    return f"gw:{{{tenant}}}:tokens", f"gw:{{{tenant}}}:requests", f"gw:{{{tenant}}}:in_flight"


@dataclass
class Ticket:
    """An admitted request: where its place is held (Redis or this process), released by ``finish``."""

    tenant: str
    request_id: str
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
    counts: dict[str, int] = field(
        default_factory=lambda: {"shared_decisions": 0, "local_decisions": 0, "redis_errors": 0}
    )
    running: dict[str, Ticket] = field(default_factory=dict)  # held in Redis, renewed while they run
    down_until: float = 0.0

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
        self._finish = self.redis.register_script(FINISH)
        self._renew = self.redis.register_script(RENEW)

    @property
    def redis_up(self) -> bool:
        return time.monotonic() >= self.down_until

    async def admit(
        self, tenant: str, limits: contract.TenantLimits, request_id: str
    ) -> tuple[str, Ticket | None]:
        """'' and a ticket when the request may go, else which limit it hit. A tenant without limits
        gets no ticket and costs nothing."""
        if not limits:
            return "", None
        if self.redis_up:
            try:
                hit = await self._admit(
                    keys=keys(tenant), args=_admit_args(limits, request_id, self.lease_seconds)
                )
            except (RedisError, OSError) as exc:
                self._lost(exc)
            else:
                self.counts["shared_decisions"] += 1
                ticket = Ticket(tenant, request_id, limits, shared=True)
                if not hit and limits.get("concurrent_requests"):
                    self.running[request_id] = ticket
                return (refusal(KINDS[int(hit)], limits) if hit else ""), ticket
        self.counts["local_decisions"] += 1
        return self.local.admit(tenant, limits), Ticket(tenant, request_id, limits, shared=False)

    async def finish(self, ticket: Ticket | None, tokens: int) -> None:
        if ticket is None:
            return
        if not ticket.shared:
            self.local.finish(ticket.tenant, ticket.limits, tokens)
            return
        self.running.pop(ticket.request_id, None)
        tokens_per_minute = ticket.limits.get("tokens_per_minute", 0)
        if not (tokens_per_minute and tokens) and not ticket.limits.get("concurrent_requests"):
            return  # nothing to write back
        tokens_key, _, in_flight = keys(ticket.tenant)
        try:
            await self._finish(
                keys=[tokens_key, in_flight], args=[tokens_per_minute, tokens, ticket.request_id]
            )
        except (RedisError, OSError) as exc:
            self._lost(exc)  # its place expires with its lease

    async def renew_forever(self) -> None:
        """Keep the places of this process's running requests while they run (a third of a lease apart)."""
        while self.url:
            await asyncio.sleep(self.lease_seconds / 3)
            with contextlib.suppress(RedisError, OSError):
                await self.renew_once()

    async def renew_once(self) -> None:
        by_tenant: dict[str, list[str]] = {}
        for ticket in list(self.running.values()):
            by_tenant.setdefault(ticket.tenant, []).append(ticket.request_id)
        for tenant, ids in by_tenant.items():
            await self._renew(keys=[keys(tenant)[2]], args=[self.lease_seconds, *ids])

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


def _admit_args(limits: contract.TenantLimits, request_id: str, lease: float) -> list[str | int | float]:
    return [
        limits.get("tokens_per_minute", 0),
        limits.get("requests_per_minute", 0),
        limits.get("concurrent_requests", 0),
        request_id,
        lease,
    ]
