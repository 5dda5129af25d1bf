"""Garbage collection: the copies of retired versions, and any bytes left in a region where residency now
forbids them."""

from contextlib import suppress
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from artifacts.choices import ReplicaState
from artifacts.drivers.stores import blob_key, store_from_config
from artifacts.models import ArtifactReplica
from artifacts.services.replication import LEASE, blobs_of
from core.choices import AuditSource
from core.principal import Principal
from core.services.audit import audit_record
from regions.usage import deployments_using
from registry.choices import VersionStatus

SYSTEM = Principal.system("artifact-gc", source=AuditSource.TASK)


def collect_garbage(retention: timedelta) -> list[str]:
    """Delete replicas of versions retired longer than ``retention`` ago, never one a deployment uses; and
    the bytes of forbidden replicas (copied before a policy narrowed), whose rows stay ``forbidden``."""
    removed = _collect_retired(timezone.now() - retention)
    for replica in (
        ArtifactReplica.objects.filter(state=ReplicaState.FORBIDDEN)
        .filter(Q(bytes_copied__gt=0) | Q(finished_at__isnull=False) | ~Q(upload_ids={}))
        .select_related("version__model__owner", "region")
    ):
        if not _claim_for_deletion(replica):
            continue  # a copy or another collector holds it
        try:
            _delete_blobs(replica)
        except Exception:
            ArtifactReplica.objects.filter(pk=replica.pk).update(lease_until=None)  # the next pass retries
            raise
        with transaction.atomic():
            ArtifactReplica.objects.filter(pk=replica.pk).update(
                bytes_copied=0, finished_at=None, upload_ids={}, lease_until=None, updated_at=timezone.now()
            )
            _audit_deleted(replica, replica.last_error)
        removed.append(str(replica))
    return removed


def _claim_for_deletion(replica: ArtifactReplica) -> bool:
    """Take the copy lease of a forbidden replica before deleting its bytes: a policy widened meanwhile
    reopens the replica, but its copy cannot start (and find half-deleted blobs "already there") until
    the lease is released."""
    now = timezone.now()
    return bool(
        ArtifactReplica.objects.filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now), pk=replica.pk)
        .filter(state=ReplicaState.FORBIDDEN)
        .update(lease_until=now + LEASE, updated_at=now)
    )


def _audit_deleted(replica: ArtifactReplica, reason: str) -> None:
    audit_record(
        actor=SYSTEM,
        action="artifact.replica_deleted",
        target=replica.version,
        tenant=replica.version.model.owner,
        message=f"{replica.region.code}: {reason}",
    )


def _delete_blobs(replica: ArtifactReplica) -> None:
    store = store_from_config(replica.region.object_store)
    for sha, _ in blobs_of(replica.version):
        if not _shared(sha, replica):
            store.delete(blob_key(sha))
    for sha, upload_id in replica.upload_ids.items():  # a copy cut short leaves parts behind
        with suppress(Exception):  # that upload may have completed or expired since
            store.abort(blob_key(sha), upload_id)


def _collect_retired(cutoff: datetime) -> list[str]:
    removed = []
    candidates = ArtifactReplica.objects.filter(
        version__status=VersionStatus.RETIRED, version__status_changed_at__lt=cutoff, state=ReplicaState.READY
    ).select_related("version__model__owner", "region")
    for replica in candidates:
        if deployments_using(replica.version):  # the rule the registry retires by, asked of regions directly
            continue
        _delete_blobs(replica)
        with transaction.atomic():
            ArtifactReplica.objects.filter(pk=replica.pk).delete()
            _audit_deleted(replica, "retired")
        removed.append(str(replica))
    return removed


def _shared(sha: str, replica: ArtifactReplica) -> bool:
    """Content addressing lets versions share files; keep a blob another live replica still needs (a
    forbidden one needs nothing)."""
    others = (
        ArtifactReplica.objects.filter(region=replica.region)
        .exclude(pk=replica.pk)
        .exclude(state=ReplicaState.FORBIDDEN)
        .select_related("version")
    )
    return any(sha in {s for s, _ in blobs_of(other.version)} for other in others)
