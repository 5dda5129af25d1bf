"""Capacity metering: the GPUs each deployment holds in each region, as segments in time."""

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from billing.models import CapacitySegment
from regions.models import DeploymentTarget


def record_allocation(target: DeploymentTarget, gpus: int, at: datetime | None = None) -> None:
    """Called by the reconciler after every observation: a changed GPU count closes the open segment and
    opens a new one. Unchanged is a single indexed read."""
    at = at or timezone.now()
    deployment = target.deployment
    open_segment = CapacitySegment.objects.filter(
        deployment=deployment, region_id=target.region_id, ended_at__isnull=True
    ).first()
    if open_segment is not None and (open_segment.gpus, open_segment.version_id) == (
        gpus,
        deployment.version_id,
    ):
        return  # a rollout to another version also starts a new segment: cost per version stays exact
    with transaction.atomic():
        if open_segment is not None:
            CapacitySegment.objects.filter(pk=open_segment.pk, ended_at__isnull=True).update(ended_at=at)
        if gpus > 0:
            CapacitySegment.objects.create(
                deployment=deployment,
                version_id=deployment.version_id,
                region_id=target.region_id,
                gpu_type=deployment.gpu_type,
                gpus=gpus,
                started_at=at,
            )
