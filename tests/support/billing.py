"""A billing history at fixed moments in the past: GPU time at known prices and requests in each hour."""

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.models import CapacitySegment, GpuPrice, UsageRecord

HISTORY = datetime(2025, 6, 10, 8, tzinfo=UTC)  # a fixed past moment, inside one month


def gpu_history(world, chat, hours: int = 10, price: str = "2.50", start: datetime = HISTORY) -> None:  # type: ignore[no-untyped-def]
    """``hours`` hours of one GPU at a known price from ``start``, and one request in each of them."""
    CapacitySegment.objects.filter(deployment=chat).delete()
    CapacitySegment.objects.create(
        deployment=chat,
        version=chat.version,
        region=chat.targets.get().region,
        gpu_type="L4",
        gpus=1,
        started_at=start,
        ended_at=start + timedelta(hours=hours),
    )
    GpuPrice.objects.create(
        region=chat.targets.get().region,
        gpu_type="L4",
        hourly_price=Decimal(price),
        effective_from=start - timedelta(days=1),
    )
    hourly_usage(world.tenant_a, chat, start, hours, prompt=100, completion=50)


def hourly_usage(  # type: ignore[no-untyped-def]
    tenant,
    deployment,
    start,
    hours: int,
    prompt: int,
    completion: int,
    version: str = "tiny-llama@1.0.0",
    track: str = "stable",
) -> None:
    """One request in each of ``hours`` hours from ``start``, in eu-west-1, served by ``track``."""
    UsageRecord.objects.bulk_create(
        UsageRecord(
            request_id=uuid.uuid4().hex,
            tenant=tenant,
            model_name=deployment.name,
            region="eu-west-1",
            deployment=deployment,
            version=version,
            track=track,
            status=200,
            prompt_tokens=prompt,
            completion_tokens=completion,
            latency_ms=10,
            started_at=start + timedelta(hours=n, minutes=30),
            hour=start + timedelta(hours=n),
        )
        for n in range(hours)
    )


def held(  # type: ignore[no-untyped-def]
    deployment, version, start: datetime, hours: int, revision: int = 0, purpose: str = "serving"
) -> CapacitySegment:
    """One L4 GPU held by a revision of ``deployment`` in its first region for ``hours`` from ``start``."""
    return CapacitySegment.objects.create(
        deployment=deployment,
        version=version,
        region=deployment.targets.order_by("revision").first().region,
        revision=revision,
        purpose=purpose,
        gpu_type="L4",
        gpus=1,
        started_at=start,
        ended_at=start + timedelta(hours=hours),
    )
