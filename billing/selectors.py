from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Count, F, QuerySet, Sum
from django.utils import timezone

from billing import reports
from billing.choices import UsageTrack
from billing.models import BudgetAlert, GpuPrice, UsageRecord
from core.choices import Scope
from core.errors import NotFound
from core.models import Tenant
from core.principal import Principal
from core.selectors import scoped, tenants_for, visible_tenant_slugs


def usage_for(principal: Principal) -> QuerySet[UsageRecord]:
    return scoped(UsageRecord.objects.select_related("tenant", "deployment"), principal, Scope.BILLING_READ)


def usage_list(principal: Principal, client_request_id: str | None = None) -> QuerySet[UsageRecord]:
    """The caller's records, newest first; a client's own X-Request-ID finds its tenants' requests only."""
    found = usage_for(principal)
    if client_request_id is not None:
        found = found.filter(client_request_id=client_request_id)
    return found


def usage_get(principal: Principal, request_id: str) -> UsageRecord:
    """A request traced (by the gateway's id) to what served it; another tenant's is simply not found."""
    record = usage_for(principal).filter(request_id=request_id).first()
    if record is None:
        raise NotFound(f"No request {request_id!r} is visible to you.")
    return record


def cost_tenants(principal: Principal) -> set[str] | None:
    """The tenants whose costs the caller sees (None: all of them, and idle capacity)."""
    tenants = visible_tenant_slugs(principal, Scope.BILLING_READ)
    if tenants is not None:
        require_cost_reader(principal)
    return tenants


def require_cost_reader(principal: Principal) -> None:
    """Costs are for those holding ``billing:read`` somewhere (403 otherwise)."""
    principal.require_any(Scope.BILLING_READ)


def prices_list(principal: Principal) -> QuerySet[GpuPrice]:
    """All prices, past ones included; Forbidden to a caller who may read no costs."""
    require_cost_reader(principal)
    return GpuPrice.objects.select_related("region")


def budget_alerts(principal: Principal) -> QuerySet[BudgetAlert]:
    return scoped(BudgetAlert.objects.select_related("tenant"), principal, Scope.BILLING_READ)


def usage_rates(principal: Principal, *, now: datetime, window: timedelta) -> dict[str, float]:
    """Requests and tokens per second over the ``window`` before ``now``, of the usage the caller sees;
    mirrored copies are no client's requests and are left out."""
    found = usage_for(principal).filter(started_at__gte=now - window, started_at__lt=now)
    found = found.exclude(track=UsageTrack.MIRROR)
    totals = found.aggregate(
        requests=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
    )
    seconds = window.total_seconds()
    tokens = (totals["prompt"] or 0) + (totals["completion"] or 0)
    return {"requests_per_second": totals["requests"] / seconds, "tokens_per_second": tokens / seconds}


def spend_to_date(principal: Principal, *, now: datetime) -> dict[str, Any]:
    """Cost today and month to date, from the same report the costs page shows (idle capacity included
    for operators; a tenant member's own tenants only)."""
    tenants = cost_tenants(principal)
    start, _ = reports.month_bounds(now.strftime("%Y-%m"))
    days = reports.summarize(reports.build(start, now), ["day"], tenants)
    today = now.date().isoformat()
    return {
        "today": sum((row["cost"] for row in days if row["day"] == today), Decimal(0)),
        "month": sum((row["cost"] for row in days), Decimal(0)),
        "currency": settings.BILLING_CURRENCY,
    }


def budget_tenants(principal: Principal) -> QuerySet[Tenant]:
    """Tenants with a monthly budget whose costs the caller may read (their own; operators: all)."""
    return tenants_for(principal, Scope.BILLING_READ).filter(monthly_budget__isnull=False).order_by("slug")


def past_degrade_threshold(*, now: datetime | None = None) -> set[int]:
    """Tenants whose spend this month (of ``now``) reached their budget's degrade threshold: gateways send
    their requests to the fallbacks their deployments declare, before the hard limit refuses them."""
    period = (now or timezone.now()).strftime("%Y-%m")
    alerts = BudgetAlert.objects.filter(
        period=period, tenant__budget_degrade_at__isnull=False, threshold__gte=F("tenant__budget_degrade_at")
    )
    return set(alerts.values_list("tenant_id", flat=True))


def over_budget(tenant_ids: list[int] | None = None, *, now: datetime | None = None) -> set[int]:
    """Tenants whose hard limit is reached in the month of ``now`` (default: the wall clock): gateways
    refuse their new requests."""
    period = (now or timezone.now()).strftime("%Y-%m")
    alerts = BudgetAlert.objects.filter(period=period, threshold__gte=100, tenant__budget_hard_limit=True)
    if tenant_ids is not None:
        alerts = alerts.filter(tenant_id__in=tenant_ids)
    return set(alerts.values_list("tenant_id", flat=True))


def served_by_engines(records: QuerySet[UsageRecord]) -> QuerySet[UsageRecord]:
    """The records an engine worked for: not those the gateways answered from their response cache (the
    engines' own counters and idleness know nothing of them)."""
    return records.exclude(track=UsageTrack.CACHE)
