"""Choosing an endpoint: lowest priority tier first, then (during a rollout) the revision, then weighted by
load with optional session affinity; and which candidate, if any, gets a shadow copy of a request."""

import hashlib
import random

from gateway import contract
from gateway.breakers import Breakers

BUCKETS = 10_000  # a split's percent has two decimals of resolution: bucket < percent * 100


def candidates(
    endpoints: list[contract.Endpoint], breakers: Breakers, tried: set[str]
) -> list[contract.Endpoint]:
    """The lowest-priority tier with endpoints left (circuit not open here, not tried for this request)."""
    left = [e for e in endpoints if e["url"] not in tried and not breakers.ejected(e["url"])]
    if not left:
        # Every circuit is open: try the untried ones anyway rather than refuse (they may have recovered).
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


# --- rollouts --------------------------------------------------------------------------------------------
def track_of(endpoint: contract.Endpoint) -> str:
    return endpoint.get("track", contract.STABLE)  # an older control plane sends no track: all stable


def bucket(*parts: object) -> int:
    """A stable 0..9999 for these parts: the same on every gateway process, host and restart."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def split_track(
    tier: list[contract.Endpoint], splits: dict[str, contract.Split], key: str, preview: str | None
) -> str:
    """The revision a request goes to in this tier's region: STABLE unless a rollout runs there and the
    preview header or the key's bucket says CANDIDATE. A bucket below the weight is the candidate's, so
    raising the weight only ever moves sessions from stable to candidate, never back."""
    region = tier[0]["region"]  # the control plane makes each region one tier
    split = splits.get(region)
    rollout = [e["deployment"] for e in tier if track_of(e) == contract.CANDIDATE]
    if split is None or not rollout:
        return contract.STABLE
    if preview is not None:
        return preview
    # Salted with the deployment and region, so one session is not the first 5 % of every rollout.
    share = bucket(min(rollout), region, key)
    return contract.CANDIDATE if share < split["candidate"] * 100 else contract.STABLE


def answering(
    endpoints: list[contract.Endpoint], splits: dict[str, contract.Split], preview: str | None
) -> list[contract.Endpoint]:
    """The endpoints that may answer a client: a candidate only where it takes a share of the region's
    requests, or when previewed. A shadow candidate, or a blue-green one before its switch, never answers
    a client, not even when the stable revision beside it is gone (the next region does, or nobody)."""
    if preview == contract.CANDIDATE:
        return endpoints
    serving = {region for region, split in splits.items() if split["candidate"] > 0}
    return [e for e in endpoints if track_of(e) != contract.CANDIDATE or e["region"] in serving]


def on_track(tier: list[contract.Endpoint], track: str) -> list[contract.Endpoint]:
    """The tier's endpoints of that revision, or the other revision's when it has none left: a missing or
    failing candidate (or stable) never fails a request the region can still serve."""
    return [e for e in tier if track_of(e) == track] or tier


def mirror_target(
    route: contract.Route, served: contract.Endpoint, request_id: str
) -> contract.Endpoint | None:
    """The candidate that gets a shadow copy of a request the stable revision served, if any: only ever one
    in the served endpoint's own region and deployment, because the route table proves residency per
    region (a candidate listed elsewhere was checked for other requests, not this one's region). A
    candidate this process ejected still gets its copies: measuring how it fails is what they are for."""
    region = served["region"]
    split = route.get("splits", {}).get(region)
    if track_of(served) != contract.STABLE or not split or split["mirror"] <= 0:
        return None
    if bucket("mirror", served["deployment"], region, request_id) >= split["mirror"] * 100:
        return None
    shadows = [
        e
        for e in route["endpoints"]
        if (e["region"], e["deployment"]) == (region, served["deployment"])
        and track_of(e) == contract.CANDIDATE
    ]
    return pick(shadows, None) if shadows else None


def engine_headers(endpoint: contract.Endpoint, request_id: str) -> dict[str, str]:
    """What every request to an engine carries: JSON, the gateway's request id and the engine's API key."""
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
    if endpoint.get("api_key"):
        headers["Authorization"] = f"Bearer {endpoint['api_key']}"
    return headers
