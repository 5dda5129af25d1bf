"""Choosing an endpoint: lowest priority tier first, weighted by load, optional session affinity."""

import hashlib
import random
import time

from gateway import contract


class Ejections:
    """Endpoints this process saw fail (connect error, 5xx before the first byte), skipped for a while."""

    def __init__(self, seconds: float):
        self.seconds, self.until = seconds, {}  # type: ignore[var-annotated]

    def eject(self, url: str) -> None:
        self.until[url] = time.monotonic() + self.seconds

    def ejected(self, url: str) -> bool:
        until = self.until.get(url)
        if until is None:
            return False
        if until < time.monotonic():
            del self.until[url]
            return False
        return True


def candidates(
    endpoints: list[contract.Endpoint], ejections: Ejections, tried: set[str]
) -> list[contract.Endpoint]:
    """The lowest-priority tier with endpoints left (not ejected here, not tried for this request)."""
    left = [e for e in endpoints if e["url"] not in tried and not ejections.ejected(e["url"])]
    if not left:
        # Every endpoint is ejected: try the untried ones anyway rather than refuse (they may have recovered).
        left = [e for e in endpoints if e["url"] not in tried]
    if not left:
        return []
    tier = min(e["priority"] for e in left)
    return [e for e in left if e["priority"] == tier]


def pick(tier: list[contract.Endpoint], affinity: str | None) -> contract.Endpoint:
    if affinity:
        # Rendezvous hashing: the same session lands on the same engine (its KV cache) while it lives.
        return max(
            tier, key=lambda e: hashlib.blake2b(f"{affinity}|{e['url']}".encode(), digest_size=8).digest()
        )
    if len(tier) == 1:
        return tier[0]
    return random.choices(tier, weights=[e["weight"] for e in tier])[0]
