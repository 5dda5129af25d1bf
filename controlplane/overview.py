"""The fleet Overview, the console's home page. It reads every app (regions, routing, billing and the core),
so it lives in the project shell, the one place allowed to import them all."""

from datetime import datetime, timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from autoscaling import console as autoscaling
from billing import selectors as billing
from controlplane.health import _broker_ok, _database_ok
from core import selectors
from core.choices import Scope
from core.errors import Forbidden
from core.principal import Principal
from core.views import page
from regions import selectors as regions
from rollouts import selectors as rollouts
from routing import selectors as routing

RATE_WINDOW = timedelta(minutes=5)
ROLLOUTS_SHOWN = 10


def clock() -> datetime:
    """The overview's notion of now; tests replace it (never the wall clock in a test)."""
    return timezone.now()


@page
def overview(request: HttpRequest, p: Principal) -> HttpResponse:
    now = clock()
    audit = selectors.audit_events_for(p)[:8] if Scope.AUDIT_READ in p.all_scopes else []
    context = {
        "tenant_count": selectors.tenants_for(p).count(),
        "user_count": selectors.users_for(p).count(),
        "token_count": selectors.tokens_active(p, now=now).count(),
        "recent_events": audit,
        "checks": {"Database": _database_ok(), "Task broker": _broker_ok()},
        "rate_window_minutes": int(RATE_WINDOW.total_seconds() // 60),
        **_fleet(p, now),
        **_spend(p, now),
    }
    return render(request, "controlplane/overview.html", context)


def _fleet(p: Principal, now: datetime) -> dict[str, Any]:
    """Regions, deployments, failovers, active rollouts and autoscaling, each from its own app's selectors."""
    if Scope.DEPLOYMENTS_READ not in p.all_scopes:
        return {}
    health = routing.region_health(p)
    capacity = regions.fleet_capacity(p)
    fleet = [
        {
            "region": region,
            "health": health.get(region.code, {}),
            "pools": [c for c in capacity if c["region"] == region],
        }
        for region in regions.regions_for(p)
    ]
    return {
        "fleet": fleet,
        "deployment_states": regions.deployment_states(p),
        "troubled_targets": list(regions.troubled_targets(p)[:8]),
        "service_events": list(routing.service_events(p).filter(at__lte=now)[:8]),
        "active_rollouts": list(rollouts.active_rollouts(p).order_by("-created_at", "-pk")[:ROLLOUTS_SHOWN]),
        "autoscaling": autoscaling.fleet_scaling(p, now=now),
    }


def _spend(p: Principal, now: datetime) -> dict[str, Any]:
    try:
        billing.require_cost_reader(p)
    except Forbidden:
        return {}
    return {
        "rates": billing.usage_rates(p, now=now, window=RATE_WINDOW),
        "spend": billing.spend_to_date(p, now=now),
        "budget_alerts": list(billing.budget_alerts(p).filter(period=now.strftime("%Y-%m"))[:8]),
    }
