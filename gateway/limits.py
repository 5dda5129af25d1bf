"""Per-tenant limits on requests and tokens per minute (token buckets, per gateway process)."""

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


class Limits:
    def __init__(self) -> None:
        self.buckets: dict[tuple[str, str], Bucket] = {}

    def _bucket(self, tenant: str, kind: str, per_minute: int) -> Bucket:
        bucket = self.buckets.get((tenant, kind))
        if bucket is None or bucket.capacity != per_minute:
            bucket = self.buckets[(tenant, kind)] = Bucket(per_minute)
        return bucket

    def admit(self, tenant: str, limits: contract.TenantLimits) -> str:
        """'' when the request may go, else which limit it hit."""
        tokens = limits.get("tokens_per_minute")
        if tokens and not self._bucket(tenant, "tokens", tokens).has_credit():
            return f"tokens per minute ({tokens})"
        requests = limits.get("requests_per_minute")
        if requests and not self._bucket(tenant, "requests", requests).take(1):
            return f"requests per minute ({requests})"
        return ""

    def spend_tokens(self, tenant: str, limits: contract.TenantLimits, tokens: int) -> None:
        per_minute = limits.get("tokens_per_minute")
        if per_minute:
            self._bucket(tenant, "tokens", per_minute).spend(tokens)
