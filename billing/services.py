"""Billing actions: usage ingestion from gateways (idempotent by request id, all or nothing per batch),
prices with history, budget alerts."""

import json
import logging
import urllib.request
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from billing.choices import PricingModel
from billing.costing import CENT
from billing.models import BudgetAlert, GpuPrice, UsageRecord
from controlplane.choices import AuditSource, Scope
from controlplane.errors import Conflict, ValidationFailed
from controlplane.models import Tenant
from controlplane.principal import Principal
from controlplane.services.audit import audit_record
from regions.models import Deployment, Region

log = logging.getLogger(__name__)
SYSTEM = Principal.system("billing", source=AuditSource.TASK)

MAX_BATCH = 5000
FIELDS = {
    "request_id",
    "tenant",
    "model_name",
    "region",
    "deployment",
    "version",
    "artifact_sha256",
    "endpoint",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms",
    "attempts",
    "stream",
    "started_at",
}


def usage_ingest(*, actor: Principal, records: list[dict[str, Any]]) -> dict[str, int]:
    """Store a gateway's batch; records already stored (a re-sent batch) are skipped, never counted twice."""
    actor.require(Scope.GATEWAY_SYNC)
    if not isinstance(records, list) or len(records) > MAX_BATCH:
        raise ValidationFailed(f"records must be a list of at most {MAX_BATCH} usage records.")
    tenants = dict(Tenant.objects.values_list("slug", "pk"))
    rows = [_row(n, record, tenants) for n, record in enumerate(records)]
    deployments = set(
        Deployment.objects.filter(pk__in={r.deployment_id for r in rows}).values_list("pk", flat=True)
    )
    for row in rows:
        if row.deployment_id not in deployments:
            row.deployment_id = None  # deleted since; the record keeps region, version and checksum
    with transaction.atomic():
        known = set(
            UsageRecord.objects.filter(request_id__in=[r.request_id for r in rows]).values_list(
                "request_id", flat=True
            )
        )
        fresh = {
            r.request_id: r for r in rows if r.request_id not in known
        }  # duplicates inside the batch too
        UsageRecord.objects.bulk_create(fresh.values(), ignore_conflicts=True)
    return {"accepted": len(fresh), "duplicates": len(rows) - len(fresh)}


def _row(index: int, record: dict[str, Any], tenants: dict[str, int]) -> UsageRecord:
    if not isinstance(record, dict) or not {"request_id", "tenant", "started_at"} <= set(record):
        raise ValidationFailed(f"records[{index}] needs request_id, tenant and started_at.")
    unknown = set(record) - FIELDS
    if unknown:
        raise ValidationFailed(f"records[{index}] has unknown fields: {', '.join(sorted(unknown))}.")
    tenant_id = tenants.get(record["tenant"])
    started = parse_datetime(str(record["started_at"]))
    if tenant_id is None or started is None:
        raise ValidationFailed(f"records[{index}]: unknown tenant or unreadable started_at.")
    try:
        return UsageRecord(
            request_id=str(record["request_id"])[:64],
            tenant_id=tenant_id,
            model_name=str(record.get("model_name", ""))[:100],
            region=str(record.get("region", ""))[:41],
            deployment_id=int(record["deployment"]) if record.get("deployment") else None,
            version=str(record.get("version", ""))[:200],
            artifact_sha256=str(record.get("artifact_sha256", ""))[:64],
            endpoint=str(record.get("endpoint", ""))[:500],
            status=int(record.get("status", 0)),
            prompt_tokens=max(0, int(record.get("prompt_tokens", 0))),
            completion_tokens=max(0, int(record.get("completion_tokens", 0))),
            latency_ms=float(record.get("latency_ms", 0)),
            attempts=max(1, int(record.get("attempts", 1))),
            stream=bool(record.get("stream", False)),
            started_at=started,
            hour=started.astimezone(UTC).replace(minute=0, second=0, microsecond=0),
        )
    except (TypeError, ValueError) as exc:
        raise ValidationFailed(f"records[{index}]: {exc}") from exc


def price_set(
    *,
    actor: Principal,
    region: Region,
    gpu_type: str,
    pricing_model: str,
    hourly_price: Decimal,
    currency: str,
    effective_from: datetime,
) -> GpuPrice:
    """Add a price from a moment on; earlier hours keep the prices that were in force then."""
    actor.require(Scope.BILLING_WRITE)
    if pricing_model not in PricingModel.values:
        raise ValidationFailed(f"pricing_model must be one of {', '.join(PricingModel.values)}.")
    if hourly_price < 0 or len(currency) != 3 or not currency.isalpha():
        raise ValidationFailed("hourly_price must be ≥ 0 and currency a 3-letter code.")
    if currency.upper() != settings.BILLING_CURRENCY:
        raise ValidationFailed(f"Prices are kept in {settings.BILLING_CURRENCY}; convert before entering.")
    with transaction.atomic():
        if GpuPrice.objects.filter(
            region=region, gpu_type=gpu_type, pricing_model=pricing_model, effective_from=effective_from
        ).exists():
            raise Conflict(
                "A price for this region, GPU type and pricing model starts at that moment already."
            )
        price = GpuPrice.objects.create(
            region=region,
            gpu_type=gpu_type,
            pricing_model=pricing_model,
            hourly_price=hourly_price,
            currency=currency.upper(),
            effective_from=effective_from,
            created_by_name=actor.name,
        )
        audit_record(
            actor=actor,
            action="billing.price_set",
            target=price,
            after={"price": str(price), "effective_from": effective_from},
        )
    return price


DEFAULT_THRESHOLDS = [50, 80, 100]


def thresholds_of(tenant: Tenant) -> list[int]:
    chosen = sorted({int(t) for t in tenant.budget_thresholds}) or DEFAULT_THRESHOLDS
    return sorted({*chosen, 100}) if tenant.budget_hard_limit else chosen


def evaluate_budgets(now: datetime | None = None) -> list[BudgetAlert]:
    """Fire every threshold crossed this month, once: an audit event, the dashboard banner, a webhook."""
    from billing.reports import build, month_bounds, spent_by_tenant

    now = now or timezone.now()
    period = now.strftime("%Y-%m")
    tenants = list(Tenant.objects.filter(monthly_budget__isnull=False, monthly_budget__gt=0))
    if not tenants:
        return []
    start, _ = month_bounds(period)
    spent = spent_by_tenant(build(start, now, now=now))
    fired = []
    for tenant in tenants:
        used, budget = spent.get(tenant.slug, Decimal(0)), tenant.monthly_budget or Decimal(1)
        percent = used / budget * 100
        for threshold in thresholds_of(tenant):
            if percent < threshold:
                break
            alert, created = BudgetAlert.objects.get_or_create(
                tenant=tenant,
                period=period,
                threshold=threshold,
                defaults={"spent": used.quantize(CENT), "budget": budget},
            )
            if created:
                _announce(tenant, alert)
                fired.append(alert)
    return fired


def _announce(tenant: Tenant, alert: BudgetAlert) -> None:
    blocked = tenant.budget_hard_limit and alert.threshold >= 100
    message = (
        f"{tenant.slug} spent {alert.spent} of its {alert.budget} {tenant.budget_currency} budget for "
        f"{alert.period} ({alert.threshold}% threshold)" + ("; new requests are refused" if blocked else "")
    )
    audit_record(
        actor=SYSTEM, action="billing.budget_threshold", target=alert, tenant=tenant, message=message
    )
    if tenant.budget_webhook:
        payload = {
            "tenant": tenant.slug,
            "period": alert.period,
            "threshold": alert.threshold,
            "spent": str(alert.spent),
            "budget": str(alert.budget),
            "message": message,
        }
        transaction.on_commit(lambda: _post(tenant.budget_webhook, payload))


def _post(url: str, payload: dict[str, Any]) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except OSError as exc:  # best effort: the audit event and the banner are the record
        log.warning("budget webhook %s failed: %s", url, exc)


def over_budget(tenant_ids: list[int] | None = None, *, now: datetime | None = None) -> set[int]:
    """Tenants whose hard limit is reached in the month of ``now`` (default: the wall clock): gateways
    refuse their new requests."""
    period = (now or timezone.now()).strftime("%Y-%m")
    alerts = BudgetAlert.objects.filter(period=period, threshold__gte=100, tenant__budget_hard_limit=True)
    if tenant_ids is not None:
        alerts = alerts.filter(tenant_id__in=tenant_ids)
    return set(alerts.values_list("tenant_id", flat=True))
