"""Actions on replicas: request a copy ahead of deployment, retry a failed one, collect garbage."""

from datetime import timedelta
from functools import partial

from django.db import transaction
from django.utils import timezone

from controlplane.choices import AuditSource, Scope
from controlplane.errors import Conflict
from controlplane.principal import Principal
from controlplane.services.audit import audit_record
from regions.artifacts.replication import blobs_of, replica_for
from regions.artifacts.stores import blob_key, store_from_config
from regions.choices import DeploymentState, ReplicaState
from regions.models import ArtifactReplica, Deployment, Region
from registry.choices import VersionStatus
from registry.models import ModelVersion

SYSTEM = Principal.system("artifact-gc", source=AuditSource.TASK)


def replica_request(*, actor: Principal, version: ModelVersion, region: Region) -> ArtifactReplica:
    """Copy a version's weights into a region ahead of any deployment (residency is checked by the copy)."""
    actor.require(Scope.REGISTRY_WRITE, version.model.owner_id)
    replica = replica_for(version, region)
    _enqueue(replica)
    return replica


def replica_retry(*, actor: Principal, replica: ArtifactReplica) -> ArtifactReplica:
    actor.require(Scope.REGISTRY_WRITE, replica.version.model.owner_id)
    with transaction.atomic():
        if not ArtifactReplica.objects.filter(pk=replica.pk, state=ReplicaState.FAILED).update(
            state=ReplicaState.PENDING, attempts=0, last_error="", updated_at=timezone.now()
        ):
            raise Conflict(f"Replica {replica} is {replica.state}; only failed replicas are retried.")
        audit_record(
            actor=actor,
            action="artifact.replication_retried",
            target=replica.version,
            tenant=replica.version.model.owner,
            message=replica.region.code,
        )
        _enqueue(replica)
    replica.refresh_from_db()
    return replica


def _enqueue(replica: ArtifactReplica) -> None:
    from regions.tasks import replicate_artifact

    transaction.on_commit(partial(replicate_artifact.delay, replica.pk))


def collect_garbage(retention: timedelta) -> list[str]:
    """Delete replicas of versions retired longer than ``retention`` ago, never one a deployment uses."""
    cutoff = timezone.now() - retention
    removed = []
    candidates = ArtifactReplica.objects.filter(
        version__status=VersionStatus.RETIRED, version__status_changed_at__lt=cutoff, state=ReplicaState.READY
    ).select_related("version__model__owner", "region")
    for replica in candidates:
        used = Deployment.objects.filter(version=replica.version).exclude(state=DeploymentState.DELETED)
        if used.exists():
            continue
        store = store_from_config(replica.region.object_store)
        for sha, _ in blobs_of(replica.version):
            if not _shared(sha, replica):
                store.delete(blob_key(sha))
        with transaction.atomic():
            ArtifactReplica.objects.filter(pk=replica.pk).delete()
            audit_record(
                actor=SYSTEM,
                action="artifact.replica_deleted",
                target=replica.version,
                tenant=replica.version.model.owner,
                message=f"{replica.region.code}: retired",
            )
        removed.append(str(replica))
    return removed


def _shared(sha: str, replica: ArtifactReplica) -> bool:
    """Content addressing lets versions share files; keep a blob another live replica still needs."""
    others = (
        ArtifactReplica.objects.filter(region=replica.region).exclude(pk=replica.pk).select_related("version")
    )
    return any(sha in {s for s, _ in blobs_of(other.version)} for other in others)
