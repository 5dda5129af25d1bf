"""Billing actions: usage ingestion from gateways (idempotent by request id, all or nothing per batch),
prices with history, budget alerts."""

import logging
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from billing.choices import PricingModel, UsageTrack
from billing.costing import CENT
from billing.models import BudgetAlert, GpuPrice, UsageRecord
from billing.reports import build, month_bounds, spent_by_tenant, thresholds_of
from billing.residency import audit_usage_outside_residency
from core.choices import AuditSource, Scope
from core.errors import Conflict, ValidationFailed
from core.models import Tenant
from core.principal import Principal
from core.services.audit import audit_record
from core.webhooks import post_json
from gateway import contract
from regions.models import Deployment, Region

log = logging.getLogger(__name__)
TRACE_ID = re.compile(r"[0-9a-f]{32}")
SYSTEM = Principal.system("billing", source=AuditSource.TASK)

MAX_BATCH = 5000


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
        audit_usage_outside_residency(fresh.values())  # billed all the same, but never silently
    return {"accepted": len(fresh), "duplicates": len(rows) - len(fresh)}


def _row(index: int, record: dict[str, Any], tenants: dict[str, int]) -> UsageRecord:
    if not isinstance(record, dict) or not contract.USAGE_REQUIRED_FIELDS.issubset(record):
        raise ValidationFailed(f"records[{index}] needs request_id, tenant and started_at.")
    unknown = set(record) - contract.USAGE_FIELDS
    if unknown:
        raise ValidationFailed(f"records[{index}] has unknown fields: {', '.join(sorted(unknown))}.")
    try:
        return _usage_record(record, tenants)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationFailed(f"records[{index}]: {exc}") from exc


def _usage_record(record: dict[str, Any], tenants: dict[str, int]) -> UsageRecord:
    """One record, every value checked against its column (a bad one raises ValueError, never a 500)."""
    tenant_id = tenants.get(_text(record, "tenant", 50))
    started = parse_datetime(_text(record, "started_at", 64))
    if tenant_id is None or started is None:
        raise ValueError("unknown tenant or unreadable started_at")
    request_id = _text(record, "request_id", 64)
    if not request_id:
        raise ValueError("request_id must not be empty")
    stream = record.get("stream", False)
    if not isinstance(stream, bool):
        raise ValueError("stream must be true or false")
    status = _whole(record, "status", 0, 599)
    if 0 < status < 100:
        raise ValueError("status must be an HTTP status (100-599)")
    return UsageRecord(
        request_id=request_id,
        client_request_id=_text(record, "client_request_id", 128),
        tenant_id=tenant_id,
        model_name=_text(record, "model_name", 100),
        served_model_name=_text(record, "served_model_name", 100),
        degraded=_degraded(record),
        trace_id=_trace_id(record),
        pipeline=_text(record, "pipeline", 200),
        stage=_text(record, "stage", 63),
        region=_text(record, "region", 41),
        deployment_id=_whole(record, "deployment", 0, 2**63 - 1) or None,
        version=_text(record, "version", 200),
        artifact_sha256=_text(record, "artifact_sha256", 64),
        endpoint=_text(record, "endpoint", 500),
        status=status,
        prompt_tokens=_whole(record, "prompt_tokens", 0, 2**31 - 1),
        completion_tokens=_whole(record, "completion_tokens", 0, 2**31 - 1),
        latency_ms=_milliseconds(record, "latency_ms") or 0.0,
        ttft_ms=_milliseconds(record, "ttft_ms"),
        attempts=_whole(record, "attempts", 1, 32767, default=1),
        candidate_errors=_whole(record, "candidate_errors", 0, 32767),
        stream=stream,
        track=_track(record),
        started_at=started,
        hour=started.astimezone(UTC).replace(minute=0, second=0, microsecond=0),
    )


def _text(record: dict[str, Any], field: str, longest: int) -> str:
    """A string column, cut to its length; NUL (which PostgreSQL refuses in text) is refused here."""
    value = record.get(field)
    if value is None:
        return ""
    if not isinstance(value, str | int):
        raise ValueError(f"{field} must be a string")
    text = str(value)
    if "\x00" in text:
        raise ValueError(f"{field} contains a NUL character")
    return text[:longest]


def _whole(record: dict[str, Any], field: str, low: int, high: int, default: int = 0) -> int:
    value = record.get(field)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{field} must be a whole number")
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{field} must be between {low} and {high}")
    return number


def _milliseconds(record: dict[str, Any], field: str) -> float | None:
    """A duration of at most a day; None when absent or null."""
    value = record.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{field} must be a number")
    number = float(value)
    if not 0 <= number <= 86_400_000:  # also refuses NaN and infinity
        raise ValueError(f"{field} must be between 0 and 86400000")
    return number


def _trace_id(record: dict[str, Any]) -> str:
    value = record.get("trace_id") or ""
    if not isinstance(value, str) or (value and not TRACE_ID.fullmatch(value)):
        raise ValueError("trace_id must be 32 lowercase hex digits")
    return value


def _degraded(record: dict[str, Any]) -> str:
    value = record.get("degraded") or ""
    if value not in ("", *contract.DEGRADED_REASONS):
        raise ValueError(f"degraded must be one of {', '.join(contract.DEGRADED_REASONS)}")
    return str(value)


def _track(record: dict[str, Any]) -> str:
    """Absent or null is stable (a gateway from before rollouts); anything but the three is refused, since a
    mirrored request counted as stable would be billed to a tenant who never saw it."""
    value = record.get("track")
    if value is None:
        return UsageTrack.STABLE
    if not isinstance(value, str) or value not in UsageTrack.values:
        raise ValueError(f"track must be one of {', '.join(UsageTrack.values)}")
    return value


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


def evaluate_budgets(now: datetime | None = None) -> list[BudgetAlert]:
    """Fire every threshold crossed this month, once: an audit event, the dashboard banner, a webhook."""
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
            alert = budget_alert_fire(
                tenant=tenant, period=period, threshold=threshold, spent=used.quantize(CENT), budget=budget
            )
            if alert is not None:
                fired.append(alert)
    return fired


def budget_alert_fire(
    *, tenant: Tenant, period: str, threshold: int, spent: Decimal, budget: Decimal
) -> BudgetAlert | None:
    """Fire one threshold of one month at most once: the alert row and its audit event in one transaction,
    the webhook once that transaction commits. None: it had fired already.

    The insert is the compare-and-set: the row is unique per (tenant, period, threshold), so a concurrent
    evaluator's insert waits for ours and then finds it, and fires nothing. A failure before the commit
    leaves neither row nor event (and posts nothing), so the next evaluation fires it again."""
    with transaction.atomic():
        alert, created = BudgetAlert.objects.get_or_create(
            tenant=tenant, period=period, threshold=threshold, defaults={"spent": spent, "budget": budget}
        )
        if not created:
            return None
        _announce(tenant, alert)
    return alert


def _announce(tenant: Tenant, alert: BudgetAlert) -> None:
    """The audit event, and the webhook queued on commit of the caller's transaction."""
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
        transaction.on_commit(lambda: post_json(tenant.budget_webhook, payload))
