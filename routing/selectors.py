"""What each caller may see of routing: operators everything, tenants their own routes and events."""

import time
from dataclasses import replace
from typing import Any

from django.db.models import QuerySet

from controlplane.choices import Scope
from controlplane.principal import Principal
from controlplane.selectors import scoped, visible_tenant_slugs
from regions.choices import RegionStatus
from regions.models import DeploymentTarget, Region
from regions.selectors import deployments_for
from routing import services
from routing.choices import Health, RoutingEventKind
from routing.models import EndpointHealth, RouteTable, RoutingEvent
from routing.routes import route_table

LONG_POLL_LIMIT = 30.0


def visible_tenants(principal: Principal) -> set[str] | None:
    """None: every tenant (an operator)."""
    return visible_tenant_slugs(principal, Scope.DEPLOYMENTS_READ)


def tenants_view(principal: Principal, tenants: dict[str, Any]) -> dict[str, Any]:
    allowed = visible_tenants(principal)
    return tenants if allowed is None else {slug: view for slug, view in tenants.items() if slug in allowed}


def table_after(etag: str, wait: float) -> RouteTable:
    """The newest table, waiting up to ``wait`` seconds for one whose ETag differs from ``etag``."""
    deadline = time.monotonic() + min(max(wait, 0.0), LONG_POLL_LIMIT)
    while True:
        table = services.current() or services.publish()
        if table.etag != etag or time.monotonic() >= deadline:
            return table
        time.sleep(0.2)


def endpoint_health(principal: Principal) -> QuerySet[EndpointHealth]:
    found = EndpointHealth.objects.select_related("region")
    if principal.sees_all(Scope.DEPLOYMENTS_READ):
        return found
    # Their deployments' endpoints, unhealthy ones included (those are no longer in the route table).
    targets = DeploymentTarget.objects.filter(deployment__in=deployments_for(principal))
    return found.filter(url__in={url for urls in targets.values_list("endpoints", flat=True) for url in urls})


def routing_events(principal: Principal) -> QuerySet[RoutingEvent]:
    return scoped(RoutingEvent.objects.select_related("tenant"), principal, Scope.DEPLOYMENTS_READ)


def what_if(principal: Principal, region_code: str) -> list[dict[str, Any]]:
    """If ``region_code`` failed: which tenants' models would lose service, and which would lose capacity."""
    policies, placements = services.policies(), services.placements()
    failed = [p if p.region != region_code else replace(p, region_active=False) for p in placements]
    before = tenants_view(principal, route_table(policies, placements))
    after = tenants_view(principal, route_table(policies, failed))
    impact = []
    for slug, view in sorted(before.items()):
        for name, route in sorted(view["models"].items()):
            now = after[slug]["models"][name]
            lost = [e for e in route["endpoints"] if e["region"] == region_code]
            if not lost and route["endpoints"]:
                continue
            if not route["endpoints"]:
                continue  # already unavailable; the region changes nothing
            impact.append(
                {
                    "tenant": slug,
                    "model": name,
                    "effect": "loses service" if not now["endpoints"] else "loses capacity",
                    "endpoints_before": len(route["endpoints"]),
                    "endpoints_after": len(now["endpoints"]),
                    "served_from_after": sorted({e["region"] for e in now["endpoints"]}),
                    "reason": now.get("unavailable", ""),
                }
            )
    return impact


SERVICE_EVENTS = (
    RoutingEventKind.FAILOVER,
    RoutingEventKind.FAILBACK,
    RoutingEventKind.UNAVAILABLE,
    RoutingEventKind.RESTORED,
)


def service_events(principal: Principal) -> QuerySet[RoutingEvent]:
    """Failovers, failbacks and outages the caller may see, newest first (the overview's timeline)."""
    return routing_events(principal).filter(kind__in=SERVICE_EVENTS)


def region_health(principal: Principal) -> dict[str, dict[str, Any]]:
    """Per region code: the prober's healthy and unhealthy endpoints (the caller's own, for a tenant
    member) and one word for the region: the operator's status if not active, else healthy/degraded."""
    counts: dict[str, dict[str, Any]] = {}
    for code, state in endpoint_health(principal).values_list("region__code", "state"):
        found = counts.setdefault(code, {Health.HEALTHY: 0, Health.UNHEALTHY: 0})
        found[state] += 1
    health = {}
    for region in Region.objects.all():
        found = counts.get(region.code, {Health.HEALTHY: 0, Health.UNHEALTHY: 0})
        if region.status != RegionStatus.ACTIVE:
            word = region.status
        else:
            word = "degraded" if found[Health.UNHEALTHY] else "healthy"
        health[region.code] = {
            "state": word,
            "healthy": found[Health.HEALTHY],
            "unhealthy": found[Health.UNHEALTHY],
        }
    return health
