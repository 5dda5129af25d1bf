"""The route table, computed from a snapshot of the platform: pure functions, no database.

For every tenant and every model name it may call (its deployments' names), the endpoints that may serve
it, in priority tiers and with weights. Residency is a hard filter; everything else is a preference:

- eligible: the deployment is ready in the region, the region is active, residency lets the version be
  served there to this tenant (``core.residency``; per tenant, also for shared deployments), the
  weights are verified there, and the endpoint is healthy;
- priority: regions ordered by distance from the tenant's home region (nearest first), then by price,
  then by code: a gateway sends to the lowest tier that has an endpoint left, so traffic stays home
  and moves to the next compliant region only when home has nothing healthy. A region the autoscaler
  spilled a full region's overflow into (``overflow_of``) shares that region's tier;
- weight (1-100, within a tier): load headroom from vLLM's own gauges (waiting requests count four times
  a running one, KV-cache usage above 90 % halves the weight).

A name with no eligible endpoint keeps an entry with an empty endpoint list and the reason, so gateways
answer 503 naming the residency constraint instead of spilling into a region outside it. When one of its
regions could serve but sits at zero replicas because the autoscaler found it idle, the entry names the
first such region as ``activatable`` (same order, same residency rule): a gateway holds the request and has
the control plane wake exactly that region, so the route computation stays the one place residency is
decided, also for a request that arrives at zero.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from core.residency import Residency, Weights, residency_refusal
from gateway import contract


@dataclass(frozen=True)
class Endpoint:
    url: str
    healthy: bool = True
    running: float = 0.0  # vllm:num_requests_running
    waiting: float = 0.0  # vllm:num_requests_waiting
    kv_cache: float = 0.0  # vllm:kv_cache_usage_perc, 0..1


@dataclass(frozen=True)
class Placement:
    """One deployment in one region, with what the route computation needs to know about both."""

    tenant: str
    name: str  # what clients put in "model"
    deployment_id: int
    version: str  # "model@1.2.0"
    served_model: str  # what the engine answers to
    artifact_sha256: str
    allowed_jurisdictions: frozenset[str]
    region: str
    jurisdiction: str
    region_active: bool
    ready: bool
    weights_verified: bool
    endpoints: tuple[Endpoint, ...] = ()
    location: tuple[float, float] | None = None  # latitude, longitude
    gpu_hour_price: Decimal | None = None
    owner: Residency | None = None  # the version's owning tenant; None for a platform catalog version
    shared: bool = False  # a platform deployment serving every tenant: gateways salt its prefix cache
    track: str = contract.STABLE  # which revision: the stable one or a rollout's candidate beside it
    # The region is draining: it serves, in a tier after every active region, until its replicas are
    # re-placed and retire (capacity first, then drain), and takes no wake-ups.
    draining: bool = False
    traffic_percent: int = 0  # a candidate's share of the region's requests
    mirror_percent: int = 0  # the share of the region's requests copied to a candidate (shadow)
    activatable: bool = False  # at zero replicas because idle (not paused by hand): a request wakes it
    overflow_of: str = ""  # the region whose overflow this one takes (the autoscaler spilled here): its tier
    fallbacks: tuple[str, ...] = ()  # the deployment's fallback model names, in order
    production: bool = False  # the version is in production: the only answers the response cache keeps


@dataclass(frozen=True)
class TenantPolicy:
    slug: str
    residency: frozenset[str]
    home: tuple[float, float] | None = None  # the home region's location
    limits: contract.TenantLimits = field(default_factory=contract.TenantLimits)
    blocked: str = ""  # why gateways refuse every new request (a budget's hard limit)
    degraded: str = ""  # why gateways send requests to fallbacks (past the budget's degrade threshold)
    response_cache: dict[str, int] = field(default_factory=dict)  # model name → TTL seconds (opted in)


# An engine with requests in its queue has every sequence slot (or KV block) taken; past this KV-cache use
# the next long prompt will queue too.
SATURATED_KV_CACHE = 0.95


def saturated(endpoint: Endpoint) -> bool:
    """The engine is full: what it is sent now waits. The gateways shed lower-priority requests to a
    model whose endpoints are all saturated."""
    return endpoint.waiting >= 1 or endpoint.kv_cache >= SATURATED_KV_CACHE


def weight(endpoint: Endpoint) -> int:
    """Headroom in 1..100: an idle engine gets 100, a queue pushes it down fast."""
    pressure = endpoint.running + 4 * endpoint.waiting
    value = 100 / (1 + pressure / 8)
    if endpoint.kv_cache > 0.9:
        value /= 2
    return max(1, round(value))


def distance_km(a: tuple[float, float] | None, b: tuple[float, float] | None) -> float:
    """Great-circle distance; unknown locations sort after known ones."""
    if a is None or b is None:
        return math.inf
    lat1, lon1, lat2, lon2 = map(math.radians, (*a, *b))
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    return 2 * 6371 * math.asin(min(1.0, math.sqrt(h)))


def _refusal(policy: TenantPolicy, placement: Placement) -> str | None:
    weights = Weights(placement.version, placement.allowed_jurisdictions, placement.owner)
    return residency_refusal(
        weights, placement.jurisdiction, serving=Residency(policy.slug, policy.residency)
    )


def _why_not(policy: TenantPolicy, placement: Placement) -> str:
    """Why a placement cannot serve this tenant ('' when it can)."""
    refusal = _refusal(policy, placement)
    if refusal is not None:
        return f"{placement.region}: {refusal}"
    if not placement.region_active and not placement.draining:
        return f"{placement.region} is disabled"
    if not placement.ready and placement.activatable and placement.weights_verified:
        return f"{placement.region} is at zero replicas and wakes on a request"
    if not placement.ready:
        return f"{placement.region} is not ready"
    if not placement.weights_verified:
        return f"{placement.region} has no verified copy of the weights"
    if not any(e.healthy for e in placement.endpoints):
        return f"{placement.region} is unhealthy"
    return ""


def _activatable(policy: TenantPolicy, placements: list[Placement]) -> contract.Activatable | None:
    """The first region, in the route's order, a request may wake: inside residency, active, the weights
    verified there, the deployment at zero because idle."""
    for p in placements:
        if p.activatable and p.region_active and p.weights_verified and _refusal(policy, p) is None:
            return {"deployment": p.deployment_id, "region": p.region}
    return None


def _splits(eligible: list[Placement]) -> dict[str, contract.Split]:
    """Per region with an eligible candidate: its share of requests and of copies (a rollout's weights)."""
    return {
        p.region: {"candidate": p.traffic_percent, "mirror": p.mirror_percent}
        for p in eligible
        if p.track == contract.CANDIDATE
    }


def _tiers(eligible: list[Placement]) -> dict[str, int]:
    """Each region's tier: its place in the order, except that a region taking another's overflow shares
    that region's tier (while that one is eligible), so the two split its traffic by headroom."""
    present = {p.region for p in eligible}
    home = {p.region: p.overflow_of if p.overflow_of in present else p.region for p in eligible}
    order = {region: tier for tier, region in enumerate(dict.fromkeys(home[p.region] for p in eligible))}
    return {region: order[home[region]] for region in present}


def route(policy: TenantPolicy, placements: Iterable[Placement]) -> contract.Route:
    """The route of one model name for one tenant. A region is one tier, whichever revisions run there."""
    mine = sorted(
        placements,
        key=lambda p: (
            p.draining,  # a draining region last: it serves only while no active region can
            distance_km(policy.home, p.location),
            p.gpu_hour_price or Decimal(0),
            p.region,
            p.track != contract.STABLE,
        ),
    )
    eligible = [p for p in mine if not _why_not(policy, p)]
    tiers = _tiers(eligible)
    endpoints: list[contract.Endpoint] = [
        {
            "url": endpoint.url,
            "region": placement.region,
            "priority": tiers[placement.region],
            "weight": weight(endpoint),
            "deployment": placement.deployment_id,
            "version": placement.version,
            "served_model": placement.served_model,
            "artifact_sha256": placement.artifact_sha256,
            "shared": placement.shared,
            "jurisdiction": placement.jurisdiction,
            "track": placement.track,
            "saturated": saturated(endpoint),
        }
        for placement in eligible
        for endpoint in placement.endpoints
        if endpoint.healthy
    ]
    compliant = [p for p in mine if _refusal(policy, p) is None]
    # Where the traffic goes when everything is healthy: moving back there is a failback.
    entry: contract.Route = {"endpoints": endpoints, "preferred": compliant[0].region if compliant else ""}
    live = {e["region"] for e in endpoints if e["track"] == contract.CANDIDATE}
    splits = {region: split for region, split in _splits(eligible).items() if region in live}
    if splits:
        entry["splits"] = splits
    if not endpoints:
        allowed = ", ".join(sorted(policy.residency)) or "none"
        reasons = "; ".join(_why_not(policy, p) for p in mine) or "not deployed"
        entry["unavailable"] = (
            f"no healthy region within the tenant's data residency ({allowed}) can serve this model: "
            f"{reasons}"
        )
        woken = _activatable(policy, mine)
        if woken is not None:
            entry["activatable"] = woken
    ttl = policy.response_cache.get(mine[0].name) if mine else None
    if ttl:
        entry["cache"] = {"ttl_seconds": ttl, "places": _cache_places(compliant)}
    fallbacks = next((p.fallbacks for p in mine if p.track == contract.STABLE), ())
    if fallbacks:
        entry["fallbacks"] = list(fallbacks)  # kept by route_table only where the tenant has them
    return entry


def _cache_places(compliant: list[Placement]) -> list[contract.CachePlace]:
    """Where the route's answers may be cached: the jurisdictions of the regions residency lets serve
    this tenant, for the production releases of their stable revisions (a candidate's answers are not
    kept). Healthy or not: a cached answer may still be given while a region's engines are down."""
    places = dict.fromkeys(
        (p.jurisdiction, p.deployment_id, p.version, p.artifact_sha256)
        for p in compliant
        if p.track == contract.STABLE and p.production and p.artifact_sha256
    )
    return [
        {"jurisdiction": j, "deployment": deployment, "version": version, "artifact_sha256": digest}
        for j, deployment, version, digest in places
    ]


def _with_fallbacks(models: dict[str, contract.Route]) -> dict[str, contract.Route]:
    """Each route's fallbacks cut to names the same tenant has a route for: a fallback is only ever the
    tenant's own route, whose endpoints this computation already held to the tenant's residency and the
    fallback version's jurisdictions."""
    for name, entry in models.items():
        if "fallbacks" in entry:
            kept = [f for f in entry["fallbacks"] if f in models and f != name]
            if kept:
                entry["fallbacks"] = kept
            else:
                del entry["fallbacks"]
    return models


def route_table(
    policies: Iterable[TenantPolicy], placements: Iterable[Placement]
) -> dict[str, contract.TenantRoutes]:
    """{tenant: {"models": {name: route}, "limits": {...}}} for every tenant."""
    by_tenant: dict[str, dict[str, list[Placement]]] = {}
    for placement in placements:
        by_tenant.setdefault(placement.tenant, {}).setdefault(placement.name, []).append(placement)
    tables: dict[str, contract.TenantRoutes] = {}
    for policy in sorted(policies, key=lambda p: p.slug):
        models = {
            name: route(policy, found) for name, found in sorted(by_tenant.get(policy.slug, {}).items())
        }
        tables[policy.slug] = {
            "limits": policy.limits.copy(),
            "blocked": policy.blocked,
            "models": _with_fallbacks(models),
        }
        if policy.degraded:
            tables[policy.slug]["degraded"] = policy.degraded
    return tables
