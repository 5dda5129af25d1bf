"""Usage ingestion from gateways: idempotent by request id, all or nothing per batch."""

from typing import Any

from django.db import transaction
from django.utils.dateparse import parse_datetime

from billing.models import UsageRecord
from controlplane.choices import Scope
from controlplane.errors import ValidationFailed
from controlplane.models import Tenant
from controlplane.principal import Principal
from regions.models import Deployment

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
        )
    except (TypeError, ValueError) as exc:
        raise ValidationFailed(f"records[{index}]: {exc}") from exc
