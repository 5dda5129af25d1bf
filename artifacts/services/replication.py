"""Replicating a model version's weights from the home store into a region's store.

Residency fails closed: a region where the version may not be stored (``core.residency``: the
version's allowed jurisdictions and, for a tenant's private version, the owner's residency) gets state
``forbidden`` (audited) and not one byte; the periodic pass re-checks every replica, ready ones included, so
a narrowed policy forbids copies made before (garbage collection then deletes their bytes).

A replica is claimed with a lease by conditional UPDATE, copied blob by blob (resumable, parallel parts),
verified by SHA-256 at the destination, and only then ``ready``.

Nothing is copied for a version whose weights ingest has not read from its own source, or refused
(``weights_held``): the home store holds each digest once for every tenant, and naming a digest must not
be enough to be given its bytes.
"""

import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from artifacts.choices import REPLICA_TRANSITIONS, ReplicaState
from artifacts.drivers.copier import CopyTuning, copy_blob, verify_blob
from artifacts.drivers.stores import ObjectStore, store_from_config
from artifacts.models import ArtifactReplica
from core.choices import AuditSource
from core.principal import Principal
from core.residency import residency_refusal, weights_of
from core.services.audit import audit_record
from regions.drivers.base import DriverError
from regions.models import Region
from registry.choices import WeightsCheck
from registry.models import ModelVersion
from registry.selectors import version_files

SYSTEM = Principal.system("replicator", source=AuditSource.TASK)
LEASE = timedelta(minutes=10)
MAX_ATTEMPTS = 5
FIRST_RETRY = timedelta(seconds=30)  # then doubling: 30 s, 1 min, 2 min, 4 min
LOST_TASK = timedelta(minutes=2)  # a pending replica that long was never picked up


def needs_attempt(replica: ArtifactReplica, now: datetime) -> bool:
    """Whether a copy should be (re)started now: pending and not picked up; failed and past its backoff,
    with attempts left; or copying under an expired lease, its worker dead (the copy resumes)."""
    if replica.state == ReplicaState.PENDING:
        return replica.attempts == 0 or replica.updated_at < now - LOST_TASK
    if replica.state == ReplicaState.FAILED:
        backoff = FIRST_RETRY * 2 ** max(replica.attempts - 1, 0)
        return replica.attempts < MAX_ATTEMPTS and replica.updated_at <= now - backoff
    if replica.state in (ReplicaState.COPYING, ReplicaState.VERIFYING):
        return replica.lease_until is not None and replica.lease_until < now
    return False


def due_replicas() -> list[int]:
    """The periodic pass's list: residency applied to every replica (ready ones included), then each copy
    that needs an attempt and whose weights may leave the home store, whether or not a deployment waits on
    it (artifacts.tasks sends them)."""
    now = timezone.now()
    every = ArtifactReplica.objects.select_related("version__model__owner", "region")
    return [
        replica.pk
        for replica in every
        if not enforce_residency(replica)
        and not weights_held(replica.version)
        and needs_attempt(replica, now)
    ]


@dataclass(frozen=True)
class Audited:
    """The audit event a transition writes in its own transaction, on the replica's version."""

    actor: Principal
    action: str
    message: str


def replica_transition(
    replica: ArtifactReplica,
    to: ReplicaState,
    *,
    source: Collection[ReplicaState] | None = None,
    where: Q | None = None,
    audit: Audited | None = None,
    **fields: Any,
) -> bool:
    """Move a replica into ``to`` by compare-and-set: only from ``source`` (by default every state allowed
    into ``to``, see choices.REPLICA_TRANSITIONS), and only where ``where`` holds (a free lease). Returns
    whether this call won; the audit event is written in the same transaction, only by the winner.
    ``replica`` is updated in memory with the plain values written."""
    allowed = REPLICA_TRANSITIONS[to]
    expected = allowed if source is None else frozenset(source)
    if not expected <= allowed:
        raise ValueError(f"a replica may not move from {sorted(expected - allowed)} to {to}")
    now = timezone.now()
    values = {"updated_at": now, **fields, "state": to}
    with transaction.atomic():
        moved = ArtifactReplica.objects.filter(where or Q(), pk=replica.pk, state__in=expected).update(
            **values
        )
        if moved and audit is not None:
            audit_record(
                actor=audit.actor,
                action=audit.action,
                target=replica.version,
                tenant=replica.version.model.owner,
                message=audit.message,
            )
    if moved:
        for name, value in values.items():
            if not hasattr(value, "resolve_expression"):  # F("attempts") + 1 is the database's to compute
                setattr(replica, name, value)
    return bool(moved)


def home_store() -> ObjectStore:
    return store_from_config(settings.ARTIFACT_HOME_STORE)


def blobs_of(version: ModelVersion) -> list[tuple[str, int]]:
    """(sha256, size) of every file of the version: the manifest's files, or the single artifact."""
    return [(f.sha256, f.size_bytes) for f in version_files(version)]


HELD = {
    WeightsCheck.PENDING: "waiting for ingest to read the version's weights from its source",
    WeightsCheck.REFUSED: "ingest refused the version's weights: they are never copied out of the home store",
}


def weights_held(version: ModelVersion) -> str:
    """Why the version's weights may not leave the home store ('' when they may): ingest has not yet
    read them from the version's own source, or found them not to be what it declared."""
    return HELD.get(WeightsCheck(version.weights_check), "")


def replica_for(version: ModelVersion, region: Region) -> ArtifactReplica:
    replica, _ = ArtifactReplica.objects.get_or_create(
        version=version, region=region, defaults={"bytes_total": sum(size for _, size in blobs_of(version))}
    )
    return replica


def enforce_residency(replica: ArtifactReplica) -> bool:
    """Apply residency as it is now (policies change after copies are made): forbid the replica where the
    version's weights may not be stored, reopen a forbidden one where they now may (its copy starts over,
    ``replica`` is updated to match). True when the replica is forbidden."""
    reason = residency_refusal(weights_of(replica.version), replica.region.jurisdiction)
    if reason is not None:
        if (replica.state, replica.last_error) != (ReplicaState.FORBIDDEN, reason):
            _forbid(replica, reason)
    elif replica.state == ReplicaState.FORBIDDEN:
        _reopen(replica)
    return reason is not None


def _reopen(replica: ArtifactReplica) -> None:
    replica_transition(
        replica,
        ReplicaState.PENDING,
        source={ReplicaState.FORBIDDEN},
        audit=Audited(
            SYSTEM,
            "artifact.replication_allowed",
            f"{replica.region.code}: residency now allows the weights here",
        ),
        attempts=0,
        last_error="",
    )


def _forbid(replica: ArtifactReplica, reason: str) -> None:
    moved = replica_transition(
        replica,
        ReplicaState.FORBIDDEN,
        audit=Audited(SYSTEM, "artifact.replication_forbidden", f"{replica.region.code}: {reason}"),
        last_error=reason,
    )
    if not moved:  # forbidden already; keep the reason current (the policy may have changed again)
        ArtifactReplica.objects.filter(pk=replica.pk).exclude(last_error=reason).update(last_error=reason)


def _held_for_ingest(replica: ArtifactReplica) -> bool:
    """True (the reason recorded, the replica left as it is) while the version's weights are held: the
    periodic pass tries again once ingest has verified them."""
    held = weights_held(replica.version)
    if held:
        ArtifactReplica.objects.filter(pk=replica.pk).exclude(last_error=held).update(last_error=held)
    return bool(held)


def _claim(replica: ArtifactReplica) -> bool:
    now = timezone.now()
    return replica_transition(
        replica,
        ReplicaState.COPYING,
        where=Q(lease_until__isnull=True) | Q(lease_until__lt=now),
        lease_until=now + LEASE,
        started_at=now,
        updated_at=now,
        last_error="",
    )


def replicate(replica_id: int, tuning: CopyTuning | None = None) -> ArtifactReplica:
    """Bring one replica to ready (or forbidden/failed). Safe to call repeatedly and concurrently."""
    replica = ArtifactReplica.objects.select_related("version__model__owner", "region").get(pk=replica_id)
    if not enforce_residency(replica) and not _held_for_ingest(replica) and _claim(replica):
        try:
            _copy_and_verify(replica, tuning or CopyTuning(**settings.ARTIFACT_COPY_TUNING))
        except (DriverError, OSError, Exception) as exc:  # any failure is recorded; the next attempt resumes
            replica_transition(
                replica,
                ReplicaState.FAILED,
                last_error=str(exc)[:2000],
                attempts=F("attempts") + 1,
                lease_until=None,
            )
    replica.refresh_from_db()
    return replica


def _copy_and_verify(replica: ArtifactReplica, tuning: CopyTuning) -> None:
    source, target = home_store(), store_from_config(replica.region.object_store)
    started, moved = time.monotonic(), 0
    upload_ids: dict[str, Any] = dict(replica.upload_ids)

    def remember(sha: str) -> Any:
        def save(upload_id: str) -> None:
            upload_ids[sha] = upload_id
            ArtifactReplica.objects.filter(pk=replica.pk).update(upload_ids=upload_ids)

        return save

    done = 0  # bytes of the blobs finished before the current one
    unverified: list[str] = []  # blobs whose destination checksums could not be checked in flight
    for sha, size in blobs_of(replica.version):

        def progress(copied: int, base: int = done) -> None:
            ArtifactReplica.objects.filter(pk=replica.pk).update(bytes_copied=base + copied)

        result = copy_blob(
            source,
            target,
            sha,
            size,
            tuning=tuning,
            upload_id=upload_ids.get(sha),
            remember_upload=remember(sha),
            progress=progress,
        )
        moved += result.moved
        if not result.verified:
            unverified.append(sha)
        done += size
    # Compare-and-set: a replica forbidden meanwhile stays forbidden (garbage collection deletes the bytes).
    replica_transition(replica, ReplicaState.VERIFYING)
    for sha in unverified:
        verify_blob(target, sha)  # read back and hash what the destination holds
    seconds = max(time.monotonic() - started, 1e-6)
    replica_transition(
        replica,
        ReplicaState.READY,
        bytes_copied=replica.bytes_total,
        upload_ids={},
        lease_until=None,
        last_error="",
        throughput_mbps=round(moved / seconds / 1e6, 1) if moved else None,
        finished_at=timezone.now(),
    )
