"""Capacity metering: the GPUs each revision of a deployment holds in each region, as segments in time."""

from collections import defaultdict
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
    record_allocations([(target, gpus)], at)


def record_allocations(held: list[tuple[DeploymentTarget, int]], at: datetime | None = None) -> None:
    """``record_allocation`` for many targets (a reconcile batch): one read of their open segments, one
    insert of the segments they open."""
    if not held:
        return
    at = at or timezone.now()
    segments: dict[tuple[int, int], list[CapacitySegment]] = defaultdict(list)
    for segment in CapacitySegment.objects.filter(
        deployment_id__in={t.deployment_id for t, _ in held},
        region_id__in={t.region_id for t, _ in held},
        ended_at__isnull=True,
    ):
        segments[(segment.deployment_id, segment.region_id)].append(segment)
    with transaction.atomic():
        opened = [_allocate(t, gpus, segments[(t.deployment_id, t.region_id)], at) for t, gpus in held]
        CapacitySegment.objects.bulk_create([segment for segment in opened if segment is not None])


def _allocate(
    target: DeploymentTarget, gpus: int, held: list[CapacitySegment], at: datetime
) -> CapacitySegment | None:
    """Close what changed of the target's open segments; the segment to open, if any."""
    version = target_version(target)
    mine = next((s for s in held if s.revision == target.revision), None)
    _close_vanished([s for s in held if s.revision != target.revision], target, at)
    if mine is not None and (mine.gpus, mine.version_id, mine.purpose) == (gpus, version.pk, target.purpose):
        return None
    if mine is not None:
        CapacitySegment.objects.filter(pk=mine.pk, ended_at__isnull=True).update(ended_at=at)
    if gpus <= 0:
        return None
    return CapacitySegment(
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
