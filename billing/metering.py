"""Capacity metering: the GPUs each revision of a deployment holds in each region, as segments in time."""

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from billing.models import CapacitySegment
from regions.models import DeploymentTarget
from regions.workloads import target_version


def record_allocation(target: DeploymentTarget, gpus: int, at: datetime | None = None) -> None:
    """Called by the reconciler after every observation of a target: a changed GPU count, version or
    purpose closes the revision's open segment and opens a new one. Unchanged is a single indexed read.

    The version is the one the target runs (a candidate's own, not the deployment's), and the purpose says
    who pays: a shadow candidate's GPUs are the platform's evaluation cost, so putting it to serving starts
    the tenant's segment at that moment."""
    at = at or timezone.now()
    version = target_version(target)
    held = list(
        CapacitySegment.objects.filter(
            deployment_id=target.deployment_id, region_id=target.region_id, ended_at__isnull=True
        )
    )
    mine = next((s for s in held if s.revision == target.revision), None)
    _close_vanished([s for s in held if s.revision != target.revision], target, at)
    if mine is not None and (mine.gpus, mine.version_id, mine.purpose) == (gpus, version.pk, target.purpose):
        return
    with transaction.atomic():
        if mine is not None:
            CapacitySegment.objects.filter(pk=mine.pk, ended_at__isnull=True).update(ended_at=at)
        if gpus > 0:
            CapacitySegment.objects.create(
                deployment_id=target.deployment_id,
                version=version,
                region_id=target.region_id,
                revision=target.revision,
                purpose=target.purpose,
                gpu_type=target.deployment.gpu_type,
                gpus=gpus,
                started_at=at,
            )


def _close_vanished(others: list[CapacitySegment], target: DeploymentTarget, at: datetime) -> None:
    """Close the open segments of revisions whose target row is gone: nothing will ever report them at zero
    GPUs again, and an open segment is billed up to every report's ``now``. Only during a rollout is there
    another open revision, so outside one this costs no query."""
    if not others:
        return
    live = set(
        DeploymentTarget.objects.filter(
            deployment_id=target.deployment_id, region_id=target.region_id
        ).values_list("revision", flat=True)
    )
    gone = [s.pk for s in others if s.revision not in live]
    if gone:
        CapacitySegment.objects.filter(pk__in=gone, ended_at__isnull=True).update(ended_at=at)
