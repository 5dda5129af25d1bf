"""Per-tenant limits on requests and tokens per minute and on requests in flight, per gateway process.

These are the fallback: with a Redis configured (gateway/fleet_limits.py) the same limits hold across
every gateway process, and these apply only while Redis cannot be reached.
"""

import time

from gateway import contract


class Bucket:
    def __init__(self, per_minute: int):
        self.capacity = float(per_minute)
        self.level, self.at = self.capacity, time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.at) * self.capacity / 60)
        self.at = now

    def take(self, amount: float) -> bool:
        self._refill()
        if self.level < amount:
            return False
        self.level -= amount
        return True

    def has_credit(self) -> bool:
        self._refill()
        return self.level > 0

    def spend(self, amount: float) -> None:
        """Tokens are known only after the answer: spend them then (the level may go below zero)."""
        self._refill()
        self.level -= amount


def refusal(kind: str, limits: contract.TenantLimits) -> str:
    """What the client is told it hit: the same words whichever limiter decided."""
    if kind == "tokens":
        return f"tokens per minute ({limits.get('tokens_per_minute')})"
    if kind == "requests":
        return f"requests per minute ({limits.get('requests_per_minute')})"
    return f"requests in flight ({limits.get('concurrent_requests')})"


RATE_LIMITED, OVER_BUDGET = "rate_limit_exceeded", "insufficient_quota"  # the codes of the gateway's 429s


def rate_limited(tenant: str, refused: str) -> tuple[int, str, str]:
    """The 429 of a tenant over one of its limits (``refused``: what ``refusal`` names), for every route."""
    return 429, f"Rate limit reached for {tenant}: {refused}.", RATE_LIMITED


def over_budget(tenant: str, blocked: str) -> tuple[int, str, str]:
    """The 429 of a tenant whose budget blocks it (``blocked``: the route table's reason)."""
    return 429, f"{tenant}: {blocked}.", OVER_BUDGET


class Limits:
    def __init__(self) -> None:
        self.buckets: dict[tuple[str, str], Bucket] = {}
        self.in_flight: dict[str, int] = {}

    def _bucket(self, tenant: str, kind: str, per_minute: int) -> Bucket:
        bucket = self.buckets.get((tenant, kind))
        if bucket is None or bucket.capacity != per_minute:
            bucket = self.buckets[(tenant, kind)] = Bucket(per_minute)
        return bucket

    def admit(self, tenant: str, limits: contract.TenantLimits) -> str:
        """'' when the request may go (it then holds one of the tenant's in-flight places until
        ``finish``), else which limit it hit. Checked in the same order as the shared limiter."""
        tokens = limits.get("tokens_per_minute")
        if tokens and not self._bucket(tenant, "tokens", tokens).has_credit():
            return refusal("tokens", limits)
        concurrent = limits.get("concurrent_requests")
        if concurrent and self.in_flight.get(tenant, 0) >= concurrent:
            return refusal("concurrent", limits)
        requests = limits.get("requests_per_minute")
        if requests and not self._bucket(tenant, "requests", requests).take(1):
            return refusal("requests", limits)
        self.in_flight[tenant] = self.in_flight.get(tenant, 0) + 1
        return ""

    def finish(self, tenant: str, limits: contract.TenantLimits, tokens: int) -> None:
        """The request is done: its place is free, and its tokens count against the tenant's minute."""
        left = self.in_flight.get(tenant, 0) - 1
        if left > 0:
            self.in_flight[tenant] = left
        else:
            self.in_flight.pop(tenant, None)
        per_minute = limits.get("tokens_per_minute")
        if per_minute and tokens:
            self._bucket(tenant, "tokens", per_minute).spend(tokens)
