"""The moves of a rollout's state machine and what they do to traffic: compare-and-set transitions,
candidate revisions and their weights, rollback and promotion. Called by the user actions
(``rollouts.services.rollouts``) and by the controller; enqueues no task, so the controller may import it.

Traffic moves by the candidate targets' weights (``regions``), which reach the gateways with the next
route-table generation; rollback and promotion publish that generation before they return.
"""

from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from core.choices import AuditSource
from core.errors import InvalidTransition
from core.principal import Principal
from core.services.audit import audit_record
from core.webhooks import post_json
from regions.choices import TargetPurpose, TargetRole
from regions.models import Deployment, DeploymentTarget, Region
from regions.services.deployments import enqueue_reconcile
from registry.choices import BUILTIN_ALIASES, VersionStatus
from registry.models import ModelVersion
from registry.services.lifecycle import alias_move, version_transition
from rollouts.choices import ACTIVE_STATES, ROLLOUT_TRANSITIONS, OnFailure, RolloutState, Strategy
from rollouts.models import Rollout, RolloutEvent
from routing.services import publish

R = RolloutState
SYSTEM = Principal.system("rollouts", source=AuditSource.TASK)
CANDIDATE_DRAIN = timedelta(seconds=15)  # in-flight requests to a rolled-back candidate finish first


def event(rollout: Rollout, kind: str, message: str, at: datetime | None = None) -> None:
    RolloutEvent.objects.create(rollout=rollout, kind=kind, message=message, at=at or timezone.now())


def candidate_targets(rollout: Rollout, regions: list[str] | None = None) -> list[DeploymentTarget]:
    found = DeploymentTarget.objects.filter(
        deployment=rollout.deployment, role=TargetRole.CANDIDATE, version=rollout.candidate
    ).select_related("region")
    if regions is not None:
        found = found.filter(region__code__in=regions)
    return list(found)


# --- the state machine ------------------------------------------------------------------------------
def rollout_transition(rollout: Rollout, to: str, *, reason: str = "", **fields: Any) -> None:
    """Compare-and-set ``rollout.state`` to ``to`` (with ``fields``); a lost race or a move the machine
    does not allow is an InvalidTransition and writes nothing."""
    if to not in ROLLOUT_TRANSITIONS.get(rollout.state, frozenset()):
        raise InvalidTransition(
            f"{rollout} is {rollout.state}; it cannot become {to}.", detail={"current": rollout.state}
        )
    now = timezone.now()
    changed = Rollout.objects.filter(pk=rollout.pk, state=rollout.state).update(
        state=to, reason=reason, updated_at=now, **fields
    )
    if not changed:
        current = Rollout.objects.values_list("state", flat=True).get(pk=rollout.pk)
        raise InvalidTransition(
            f"{rollout} is {current} now (someone moved it first).", detail={"current": current}
        )
    rollout.state, rollout.reason = to, reason
    for name, value in fields.items():
        setattr(rollout, name, value)


# --- weights ----------------------------------------------------------------------------------------
def set_weights(
    rollout: Rollout, regions: list[str], *, traffic: int | None = None, mirror: int | None = None
) -> None:
    fields: dict[str, Any] = {}
    if traffic is not None:
        fields["traffic_percent"] = traffic
    if mirror is not None:
        fields["mirror_percent"] = mirror
    DeploymentTarget.objects.filter(
        deployment=rollout.deployment, role=TargetRole.CANDIDATE, region__code__in=regions
    ).update(**fields)


def ensure_candidates(rollout: Rollout, regions: list[str]) -> list[DeploymentTarget]:
    """The candidate revision in each of ``regions`` (created once; a new revision number each)."""
    existing = {t.region.code for t in candidate_targets(rollout, regions)}
    missing = [code for code in regions if code not in existing]
    if missing:
        with transaction.atomic():
            deployment = Deployment.objects.select_for_update().get(pk=rollout.deployment_id)
            top = deployment.targets.aggregate(top=Max("revision"))["top"] or 0
            purpose = (
                TargetPurpose.EVALUATION if rollout.strategy == Strategy.SHADOW else TargetPurpose.SERVING
            )
            for offset, region in enumerate(Region.objects.filter(code__in=missing).order_by("code")):
                DeploymentTarget.objects.create(
                    deployment=deployment,
                    region=region,
                    role=TargetRole.CANDIDATE,
                    revision=top + 1 + offset,
                    version=rollout.candidate,
                    desired_replicas=deployment.replicas,
                    purpose=purpose,
                )
            event(rollout, "candidates", f"candidate {rollout.candidate} starting in {', '.join(missing)}")
            enqueue_reconcile(set(Region.objects.filter(code__in=missing).values_list("pk", flat=True)))
    return candidate_targets(rollout, regions)


# --- the two ends -----------------------------------------------------------------------------------
def rollback(rollout: Rollout, to: str, reason: str, *, actor: Principal = SYSTEM) -> Rollout:
    """Candidate weight 0 everywhere in one route-table generation (published before this returns), the
    candidate revision retired, the version back to staged (or rejected), the alias left alone."""
    now = timezone.now()
    with transaction.atomic():
        rollout_transition(rollout, to, reason=reason, finished_at=now)
        targets = DeploymentTarget.objects.filter(deployment=rollout.deployment, role=TargetRole.CANDIDATE)
        regions = set(targets.values_list("region_id", flat=True))
        targets.update(
            traffic_percent=0, mirror_percent=0, role=TargetRole.RETIRING, remove_after=now + CANDIDATE_DRAIN
        )
        _return_version(rollout, reason)
        event(rollout, to, reason, at=now)
        audit_record(
            actor=actor,
            action=f"rollout.{to}",
            target=rollout,
            tenant=rollout.owner,
            message=reason,
            after={"state": to, "candidate": str(rollout.candidate)},
        )
        enqueue_reconcile(regions)
        _notify_on_commit(rollout)
    publish()
    return rollout


def _return_version(rollout: Rollout, reason: str) -> None:
    candidate = ModelVersion.objects.get(pk=rollout.candidate_id)
    others = Rollout.objects.filter(candidate=candidate, state__in=ACTIVE_STATES).exclude(pk=rollout.pk)
    if not rollout.moved_to_canary or candidate.status != VersionStatus.CANARY or others.exists():
        return
    to = VersionStatus.REJECTED if rollout.on_failure == OnFailure.REJECTED else VersionStatus.STAGED
    version_transition(actor=SYSTEM, version=candidate, to=to, reason=f"{rollout}: {reason}")


def promote(rollout: Rollout, reason: str, *, actor: Principal = SYSTEM) -> Rollout:
    """The candidate becomes the stable revision everywhere (one route-table generation), the version
    production through the registry's gate (this succeeded rollout is its evidence), the alias moves, and
    the baseline revision drains until the rollback window ends."""
    now = timezone.now()
    with transaction.atomic():
        rollout_transition(rollout, R.SUCCEEDED, reason=reason, finished_at=now)
        deployment = Deployment.objects.select_for_update().get(pk=rollout.deployment_id)
        stable = DeploymentTarget.objects.filter(deployment=deployment, role=TargetRole.STABLE)
        regions = set(stable.values_list("region_id", flat=True))
        stable.update(
            role=TargetRole.RETIRING,
            version_id=deployment.version_id,  # what it runs now: the baseline, unless an alias moved it
            remove_after=now + timedelta(seconds=rollout.rollback_window_seconds),
        )
        DeploymentTarget.objects.filter(deployment=deployment, role=TargetRole.CANDIDATE).update(
            role=TargetRole.STABLE,
            version=None,
            traffic_percent=0,
            mirror_percent=0,
            purpose=TargetPurpose.SERVING,
        )
        Deployment.objects.filter(pk=deployment.pk).update(
            version=rollout.candidate, generation=deployment.generation + 1, updated_at=now
        )
        _promote_version(rollout, reason)
        event(rollout, "succeeded", reason, at=now)
        audit_record(
            actor=actor,
            action="rollout.succeeded",
            target=rollout,
            tenant=rollout.owner,
            message=reason,
            before={"version": str(rollout.baseline)},
            after={"version": str(rollout.candidate)},
        )
        enqueue_reconcile(regions)
        _notify_on_commit(rollout)
    publish()
    return rollout


def _promote_version(rollout: Rollout, reason: str) -> None:
    candidate = ModelVersion.objects.get(pk=rollout.candidate_id)
    if rollout.promotes_version and candidate.status == VersionStatus.CANARY:
        version_transition(
            actor=SYSTEM, version=candidate, to=VersionStatus.PRODUCTION, reason=f"{rollout}: {reason}"
        )
    if rollout.alias and rollout.alias not in BUILTIN_ALIASES and rollout.promotes_version:
        alias_move(
            actor=SYSTEM, model=candidate.model, name=rollout.alias, version=candidate, reason=str(rollout)
        )


def _notify_on_commit(rollout: Rollout) -> None:
    if not rollout.webhook:
        return
    payload = {
        "rollout": rollout.pk,
        "deployment": str(rollout.deployment),
        "candidate": str(rollout.candidate),
        "state": rollout.state,
        "reason": rollout.reason,
    }
    transaction.on_commit(partial(post_json, rollout.webhook, payload))


def evidence_of(version: ModelVersion) -> str:
    """For the registry's production gate: the rollout that carried this version to the end."""
    found = Rollout.objects.filter(candidate=version, state=R.SUCCEEDED).order_by("-finished_at").first()
    return f"{found} succeeded" if found else ""
