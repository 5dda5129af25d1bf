"""What each caller may see of routing: operators everything, tenants their own routes and events."""

import time
from dataclasses import replace
from typing import Any

from django.db.models import QuerySet

from controlplane.choices import Scope
from controlplane.principal import Principal
from controlplane.selectors import scoped, tenants_for, visible_tenant_ids
from regions.models import DeploymentTarget
from regions.selectors import deployments_for
from routing import services
from routing.models import EndpointHealth, RouteTable, RoutingEvent
from routing.routes import route_table

LONG_POLL_LIMIT = 30.0


def visible_tenants(principal: Principal) -> set[str] | None:
    """None: every tenant (an operator)."""
    if visible_tenant_ids(principal, Scope.DEPLOYMENTS_READ) is None:
        return None
    return set(tenants_for(principal, Scope.DEPLOYMENTS_READ).values_list("slug", flat=True))


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
