"""When copies are asked for: ahead of deployments (the API, a version promoted to staged), on an operator's
retry, before an engine starts in a region (the reconciler's gate, through regions.hooks); and the ingest
of a newly registered version. These enqueue tasks, so they sit above artifacts.tasks, which calls only
the replication, ingest and garbage services.
"""

from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from artifacts import tasks
from artifacts.choices import ReplicaState
from artifacts.drivers.stores import Blobs, store_from_config
from artifacts.models import ArtifactReplica
from artifacts.services.replication import (
    Audited,
    enforce_residency,
    needs_attempt,
    replica_for,
    replica_transition,
    weights_held,
)
from core.choices import Scope
from core.errors import Conflict
from core.principal import Principal
from core.residency import residency_refusal, weights_of
from regions.hooks import WeightsWait
from regions.models import DeploymentTarget, Region
from regions.workloads import target_version
from registry.choices import VersionStatus, WeightsCheck
from registry.models import ModelVersion


def replica_request(*, actor: Principal, version: ModelVersion, region: Region) -> ArtifactReplica:
    """Copy a version's weights into a region ahead of any deployment; where residency forbids it the
    replica is forbidden at once (and the copy task checks again before a byte moves)."""
    actor.require(Scope.REGISTRY_WRITE, version.model.owner_id)
    replica = replica_for(version, region)
    if not enforce_residency(replica):
        _enqueue(replica)
    replica.refresh_from_db()
    return replica


def replica_retry(*, actor: Principal, replica: ArtifactReplica) -> ArtifactReplica:
    actor.require(Scope.REGISTRY_WRITE, replica.version.model.owner_id)
    with transaction.atomic():
        retried = replica_transition(
            replica,
            ReplicaState.PENDING,
            source={ReplicaState.FAILED},
            audit=Audited(actor, "artifact.replication_retried", replica.region.code),
            attempts=0,
            last_error="",
        )
        if not retried:
            raise Conflict(f"Replica {replica} is {replica.state}; only failed replicas are retried.")
        _enqueue(replica)
    replica.refresh_from_db()
    return replica


def _enqueue(replica: ArtifactReplica) -> None:
    transaction.on_commit(partial(tasks.replicate_artifact.delay, replica.pk))


def weights_gate(version: ModelVersion, region: Region) -> WeightsWait | None:
    """Whether an engine may start in ``region`` from its own copy of the version's weights: None when the
    copy there is verified; otherwise what it waits for (a copy is enqueued when one is due), or, where
    residency forbids the weights, a permanent refusal."""
    replica = replica_for(version, region)
    if enforce_residency(replica):  # a policy narrowed since the copy: never start from that copy
        replica.refresh_from_db()  # for the reason
    if replica.state == ReplicaState.READY:
        return None
    if replica.state == ReplicaState.FORBIDDEN:
        return WeightsWait(f"weights may not be stored here: {replica.last_error}", permanent=True)
    if held := weights_held(version):
        return WeightsWait(held, permanent=version.weights_check == WeightsCheck.REFUSED)
    if needs_attempt(replica, timezone.now()):
        tasks.replicate_artifact.delay(replica.pk)
    detail = f" ({replica.last_error})" if replica.state == ReplicaState.FAILED else ""
    return WeightsWait(f"waiting for artifacts: {replica.state} {replica.progress}%{detail}")


class RegionalWeights:
    """What regions asks of artifacts (regions.hooks.WeightsProvider), installed by ArtifactsConfig."""

    def gate(self, target: DeploymentTarget) -> WeightsWait | None:
        return weights_gate(target_version(target), target.region)

    def reader(self, store_config: dict[str, Any]) -> Blobs:
        return Blobs(store_from_config(store_config))


def replicate_ahead_when_staged(version: ModelVersion, state: str) -> None:
    """A staged version is about to be deployed: start copying its weights into every region with an object
    store that residency lets hold them, so the first deployment there does not wait for the copy."""
    if state != VersionStatus.STAGED or not settings.ARTIFACT_REPLICATE_ON_STAGED:
        return
    weights = weights_of(version)
    for region in Region.objects.exclude(object_store={}):
        if residency_refusal(weights, region.jurisdiction) is None:
            tasks.replicate_artifact.delay(replica_for(version, region).pk)


def ingest_when_registered(version: ModelVersion) -> None:
    """Weights are streamed into the home store by a worker once the registration commits: those of every
    version registered waiting for it (the registry decides, ``weights_check_at_registration``)."""
    if version.weights_check == WeightsCheck.PENDING:
        tasks.ingest_artifact.delay(version.pk)
