"""The moves of a rollout's state machine and what they do to traffic: compare-and-set transitions,
candidate revisions and their weights, rollback and promotion. Called by the user actions
(``rollouts.services.rollouts``) and by the controller; enqueues no task, so the controller may import it.

Traffic moves by the candidate targets' weights (``regions``), which reach the gateways with the next
route-table generation; rollback and promotion publish that generation before they return.
"""

import threading
from datetime import datetime, timedelta
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
from registry.services.access import may_override_gate
from registry.services.lifecycle import alias_move, version_transition
from rollouts.choices import (
    ACTIVE_STATES,
    ROLLBACK_STATES,
    ROLLOUT_TRANSITIONS,
    OnFailure,
    RolloutState,
    Strategy,
    Verdict,
)
from rollouts.models import Rollout, RolloutEvent
from routing.services import publish

R = RolloutState
SYSTEM = Principal.system("rollouts", source=AuditSource.TASK)
# A revision leaving the route table keeps running this long at least, so gateways get the new table and
# the requests already sent to it finish (a rolled-back candidate; a baseline, even with no rollback window).
DRAIN = timedelta(seconds=15)


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
    """The candidate revision in each of ``regions`` (created once; a new revision number each). Under the
    deployment's lock, and only while the rollout is active: a rollback (which takes the same lock) that
    lands first leaves nothing behind to run forever."""
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().get(pk=rollout.deployment_id)
        active = Rollout.objects.filter(pk=rollout.pk, state__in=ACTIVE_STATES).exists()
        existing = {t.region.code for t in candidate_targets(rollout, regions)}
        missing = [code for code in regions if code not in existing] if active else []
        if missing:
            _create_candidates(rollout, deployment, missing)
    return candidate_targets(rollout, regions)


def _create_candidates(rollout: Rollout, deployment: Deployment, codes: list[str]) -> None:
    top = deployment.targets.aggregate(top=Max("revision"))["top"] or 0
    purpose = TargetPurpose.EVALUATION if rollout.strategy == Strategy.SHADOW else TargetPurpose.SERVING
    found = list(Region.objects.filter(code__in=codes).order_by("code"))
    for offset, region in enumerate(found):
        DeploymentTarget.objects.create(
            deployment=deployment,
            region=region,
            role=TargetRole.CANDIDATE,
            revision=top + 1 + offset,
            version=rollout.candidate,
            desired_replicas=deployment.replicas,
            purpose=purpose,
        )
    event(rollout, "candidates", f"candidate {rollout.candidate} starting in {', '.join(codes)}")
    enqueue_reconcile({region.pk for region in found})


# --- the two ends -----------------------------------------------------------------------------------
def rollback(rollout: Rollout, to: str, reason: str, *, actor: Principal = SYSTEM) -> Rollout:
    """Candidate weight 0 everywhere in one route-table generation (published before this returns), the
    candidate revision retired, the version back to staged (or rejected), the alias left alone."""
    now = timezone.now()
    with transaction.atomic():
        Deployment.objects.select_for_update().filter(
            pk=rollout.deployment_id
        ).first()  # vs ensure_candidates
        rollout_transition(rollout, to, reason=reason, finished_at=now)
        targets = DeploymentTarget.objects.filter(deployment=rollout.deployment, role=TargetRole.CANDIDATE)
        regions = set(targets.values_list("region_id", flat=True))
        targets.update(
            traffic_percent=0, mirror_percent=0, role=TargetRole.RETIRING, remove_after=now + DRAIN
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
    publish()
    _notify(rollout)
    return rollout


def _return_version(rollout: Rollout, reason: str) -> None:
    candidate = ModelVersion.objects.get(pk=rollout.candidate_id)
    others = Rollout.objects.filter(candidate=candidate, state__in=ACTIVE_STATES).exclude(pk=rollout.pk)
    if not rollout.moved_to_canary or candidate.status != VersionStatus.CANARY or others.exists():
        return
    to = VersionStatus.REJECTED if rollout.on_failure == OnFailure.REJECTED else VersionStatus.STAGED
    version_transition(actor=SYSTEM, version=candidate, to=to, reason=f"{rollout}: {reason}")


def promote(rollout: Rollout, reason: str, *, actor: Principal = SYSTEM, by_hand: bool = False) -> Rollout:
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
            remove_after=now + max(timedelta(seconds=rollout.rollback_window_seconds), DRAIN),
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
        event(rollout, "succeeded", reason, at=now)
        _promote_version(rollout, reason, actor, by_hand)
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
    publish()
    _notify(rollout)
    return rollout


def _promote_version(rollout: Rollout, reason: str, actor: Principal, by_hand: bool) -> None:
    """Production through the registry's gate: this rollout is its evidence when analysis judged it in
    every region; promoted by hand, only an actor who may override a gate moves the version, with the
    override recorded. Otherwise the version stays canary, and the rollout's timeline says why."""
    candidate = ModelVersion.objects.get(pk=rollout.candidate_id)
    if not rollout.promotes_version or candidate.status != VersionStatus.CANARY:
        return
    why = f"{rollout}: {reason}"
    if not by_hand and judged_everywhere(rollout):
        version_transition(actor=SYSTEM, version=candidate, to=VersionStatus.PRODUCTION, reason=why)
    elif by_hand and may_override_gate(actor, candidate.model):
        version_transition(
            actor=actor, version=candidate, to=VersionStatus.PRODUCTION, reason=why, override=True
        )
    else:
        event(
            rollout, "version", f"{candidate} stays canary: no analysis judged this rollout in every region"
        )
        return
    if rollout.alias and rollout.alias not in BUILTIN_ALIASES:
        alias_move(
            actor=SYSTEM, model=candidate.model, name=rollout.alias, version=candidate, reason=str(rollout)
        )


def judged_everywhere(rollout: Rollout) -> bool:
    """Whether at least one successful analysis run judged the candidate in every region of the rollout."""
    regions = {code for wave in rollout.waves for code in wave}
    judged = set(rollout.analysis_runs.filter(verdict=Verdict.SUCCESSFUL).values_list("region", flat=True))
    return bool(regions) and regions <= judged


def _notify(rollout: Rollout) -> None:
    """Tell the rollout's webhook how it ended: after the route table is published (a slow receiver never
    delays the gateways), in the background, to a public address only (the URL is the tenant's)."""
    if not rollout.webhook:
        return
    payload = {
        "rollout": rollout.pk,
        "deployment": str(rollout.deployment),
        "candidate": str(rollout.candidate),
        "state": rollout.state,
        "reason": rollout.reason,
    }
    threading.Thread(
        target=post_json, args=(rollout.webhook, payload), kwargs={"public_only": True}, daemon=True
    ).start()


def evidence_of(version: ModelVersion) -> str:
    """For the registry's production gate: a rollout that carried this version to the end, judged by
    analysis in every region (a plan without judged steps, or one promoted by hand, is no evidence)."""
    for found in Rollout.objects.filter(candidate=version, state=R.SUCCEEDED, promotes_version=True):
        if judged_everywhere(found):
            return f"{found} succeeded, judged by analysis in every region"
    return ""


def alias_follow_veto(deployment: Deployment, version: ModelVersion) -> str:
    """For the reconciler (regions.hooks): a deployment with a rollout in progress moves only by it, and
    one that rolled ``version`` back does not take it because an alias moved elsewhere."""
    if Rollout.objects.filter(deployment=deployment, state__in=ACTIVE_STATES).exists():
        return "a rollout is in progress"
    last = Rollout.objects.filter(deployment=deployment, candidate=version).order_by("-created_at").first()
    if last is not None and last.state in ROLLBACK_STATES:
        return f"{version} was rolled back here ({last}: {last.reason})"
    return ""
