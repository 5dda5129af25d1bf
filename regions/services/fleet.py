"""Placement that follows the fleet: a deployment placed "in every compliant region" (placement mode
``policy``) is re-evaluated whenever the fleet changes, so where it runs stays what admitting it today
would choose.

- **A region joins** (created, re-activated, or a residency policy now allows it): the deployment is added
  there with its replicas, if the region has the GPUs free and the tenant's quota allows (otherwise an
  event says why not; the next evaluation tries again).
- **A region leaves because it drains or is disabled**: capacity first, then drain. Its replicas are
  re-placed (in a compliant region the deployment is not in yet, else on top of the compliant region it
  already runs in with the most GPUs free); the leaving target keeps serving until every replacement is
  ready with its replicas, and only then retires (out of the route table at once, its workload removed by
  the reconciler). With nowhere to re-place them, the replicas stay and an event says so.
- **A region leaves because residency no longer allows it** (the tenant's policy narrowed, the version's
  allowed jurisdictions changed): it retires at once. Nothing is ever placed outside residency, and a
  border is never crossed to keep capacity.

Every change is one audit entry (``deployment.placement_followed``) and an event on the deployment's
timeline. A deployment placed in explicit regions is left as its owner chose (an event asks them to
re-place it when its region drains); one being rolled out is evaluated once its rollout has ended.
Evaluations run on a region's creation and status change and every minute (beat), which also finishes
drains whose replacements have become ready and catches residency changes.
"""

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from core.choices import AuditSource
from core.errors import Conflict
from core.principal import Principal
from core.residency import residency_of, residency_refusal, weights_of
from core.services.audit import audit_record
from regions.choices import DeploymentState, PlacementMode, RegionStatus, TargetRole, TargetStatus
from regions.models import Deployment, DeploymentEvent, DeploymentTarget, GpuPool, Region
from regions.services import placement
from regions.services.deployments import enqueue_reconcile

SYSTEM = Principal.system("placement", source=AuditSource.TASK)


@dataclass
class Changes:
    added: dict[str, int] = field(default_factory=dict)  # region code → replicas of a new target
    grown: dict[str, tuple[int, int]] = field(default_factory=dict)  # region code → (before, after)
    retired: dict[str, str] = field(default_factory=dict)  # region code → why
    waiting: list[str] = field(default_factory=list)  # what could not be done yet, and why

    def __bool__(self) -> bool:
        return bool(self.added or self.grown or self.retired)


def placements_follow(reason: str) -> int:
    """Re-evaluate every active policy-placed deployment; returns how many changed."""
    ids = Deployment.objects.filter(
        state=DeploymentState.ACTIVE, placement_mode=PlacementMode.POLICY
    ).values_list("pk", flat=True)
    return sum(1 for pk in list(ids) if placement_follow(Deployment.objects.get(pk=pk), reason))


def placement_follow(deployment: Deployment, reason: str) -> Changes:
    """Bring one deployment's regions in line with the fleet (see the module); a no-op unless it is active,
    policy-placed and not being rolled out."""
    with transaction.atomic():
        # The same lock admission takes: two evaluations (or one and an admission) never both take the
        # last free GPUs.
        list(GpuPool.objects.select_for_update().filter(gpu_type=deployment.gpu_type).order_by("pk"))
        deployment = (
            Deployment.objects.select_for_update().select_related("owner", "version").get(pk=deployment.pk)
        )
        if not _follows(deployment):
            return Changes()
        changes = _evaluate(deployment)
        _record(deployment, changes, reason)
    return changes


def _follows(deployment: Deployment) -> bool:
    if deployment.state != DeploymentState.ACTIVE or deployment.placement_mode != PlacementMode.POLICY:
        return False
    return (
        not deployment.targets.filter(role=TargetRole.CANDIDATE).exclude(status=TargetStatus.DELETED).exists()
    )


def _serving(deployment: Deployment) -> list[DeploymentTarget]:
    return list(
        deployment.targets.filter(role=TargetRole.STABLE)
        .exclude(status=TargetStatus.DELETED)
        .select_related("region")
    )


def _evaluate(deployment: Deployment) -> Changes:
    changes = Changes()
    choices = placement.deployment_choices(deployment, deployment.replicas, exclude=deployment)
    weights, serving_in = weights_of(deployment.version), residency_of(deployment.owner)
    targets = _serving(deployment)
    here = {t.region.code for t in targets}
    for target in targets:  # residency first: nothing waits for capacity across a border
        refusal = residency_refusal(weights, target.region.jurisdiction, serving=serving_in)
        if refusal is not None:
            _retire(target, changes, f"residency: {refusal}")
    leaving = [
        t for t in targets if t.region.status != RegionStatus.ACTIVE and t.region.code not in changes.retired
    ]
    staying = [
        t for t in targets if t.region.status == RegionStatus.ACTIVE and t.region.code not in changes.retired
    ]
    for code, choice in sorted(choices.items()):
        if code not in here and choice.eligible:
            added = _add(deployment, choice.region, deployment.replicas, changes)
            staying += [added] if added else []
    for target in leaving:
        _drain(deployment, target, staying, choices, changes)
    # Re-activated before its drain ended: a later drain plans afresh rather than trust an old growth.
    DeploymentTarget.objects.filter(pk__in=[t.pk for t in staying if t.replaced_in]).update(replaced_in="")
    return changes


def _add(deployment: Deployment, region: Region, replicas: int, changes: Changes) -> DeploymentTarget | None:
    try:
        placement.check_quota(deployment.owner, replicas * deployment.gpu_count)
    except Conflict as exc:
        changes.waiting.append(f"{region.code} not added: {exc.message}")
        return None
    taken = deployment.targets.exclude(status=TargetStatus.DELETED).filter(region=region).exists()
    revision = (deployment.targets.aggregate(top=Max("revision"))["top"] or 0) + 1 if taken else 0
    target = DeploymentTarget.objects.create(
        deployment=deployment,
        region=region,
        desired_replicas=replicas,
        revision=revision,  # a new name beside a retiring workload still in the region
    )
    changes.added[region.code] = replicas
    return target


def _drain(
    deployment: Deployment,
    target: DeploymentTarget,
    staying: list[DeploymentTarget],
    choices: dict[str, Any],
    changes: Changes,
) -> None:
    """Capacity first: the leaving target's replicas are re-placed once (the region is recorded on it,
    ``replaced_in``), and it retires when the replacement serves with all its replicas."""
    code, needed = target.region.code, max(target.desired_replicas, 1)
    replacement = next((t for t in staying if t.region.code == target.replaced_in), None)
    if replacement is None:
        replacement = _replace(deployment, staying, needed, choices, changes)
        if replacement is None:
            changes.waiting.append(
                f"{code} keeps serving: no compliant region has room for {needed} replica(s)"
            )
            return
        DeploymentTarget.objects.filter(pk=target.pk).update(replaced_in=replacement.region.code)
        return  # it starts now; the leaving target retires once it is ready
    if (
        replacement.status == TargetStatus.READY
        and replacement.ready_replicas >= replacement.desired_replicas
    ):
        _retire(
            target, changes, f"region {target.region.status}; its replicas serve in {replacement.region.code}"
        )
    else:
        changes.waiting.append(f"{code} keeps serving until {replacement.region.code} is ready")


def _replace(
    deployment: Deployment,
    staying: list[DeploymentTarget],
    needed: int,
    choices: dict[str, Any],
    changes: Changes,
) -> DeploymentTarget | None:
    """Where a leaving target's replicas go: a compliant region the deployment was just added to, else the
    compliant region it runs in with the most GPUs free, grown by them (None: nowhere has room)."""
    added = [t for t in staying if t.region.code in changes.added]
    if added:
        return added[0]
    room = [  # free_gpus leaves this deployment out: its own replicas there count against them too
        (choices[t.region.code].free_gpus - t.desired_replicas * deployment.gpu_count, t)
        for t in staying
        if t.region.code in choices
        and choices[t.region.code].free_gpus >= (t.desired_replicas + needed) * deployment.gpu_count
    ]
    if not room:
        return None
    try:
        placement.check_quota(deployment.owner, needed * deployment.gpu_count)
    except Conflict:
        return None
    _, target = max(room, key=lambda pair: pair[0])
    before = target.desired_replicas
    DeploymentTarget.objects.filter(pk=target.pk).update(
        desired_replicas=F("desired_replicas") + needed, next_attempt_at=timezone.now()
    )
    changes.grown[target.region.code] = (before, before + needed)
    return target


def _retire(target: DeploymentTarget, changes: Changes, why: str) -> None:
    now = timezone.now()
    DeploymentTarget.objects.filter(pk=target.pk).update(
        role=TargetRole.RETIRING, remove_after=now, next_attempt_at=now
    )
    changes.retired[target.region.code] = why


def _record(deployment: Deployment, changes: Changes, reason: str) -> None:
    for note in changes.waiting:
        _event_once(deployment, note)
    if not changes:
        return
    parts = [f"added in {code} ({n} replica(s))" for code, n in changes.added.items()]
    parts += [f"grown in {code} {a} → {b}" for code, (a, b) in changes.grown.items()]
    parts += [f"retired from {code} ({why})" for code, why in changes.retired.items()]
    message = f"placement follows the fleet ({reason}): {'; '.join(parts)}"
    DeploymentEvent.objects.create(deployment=deployment, kind="placement", message=message)
    audit_record(
        actor=SYSTEM,
        action="deployment.placement_followed",
        target=deployment,
        tenant=deployment.owner,
        message=reason,
        after={
            "added": changes.added,
            "grown": {code: after for code, (_, after) in changes.grown.items()},
            "retired": changes.retired,
        },
    )
    Deployment.objects.filter(pk=deployment.pk).update(
        generation=F("generation") + 1, updated_at=timezone.now()
    )
    regions = set(deployment.targets.exclude(status=TargetStatus.DELETED).values_list("region_id", flat=True))
    enqueue_reconcile(regions)


def _event_once(deployment: Deployment, message: str) -> None:
    """A note repeated by every evaluation is on the timeline once, until something else happens."""
    latest = deployment.events.order_by("-pk").first()
    if latest is None or latest.message != message:
        DeploymentEvent.objects.create(deployment=deployment, kind="placement", message=message)
