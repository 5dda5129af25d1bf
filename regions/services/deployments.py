"""Creating, scaling, pausing and deleting deployments. The reconciler makes the regions follow."""

from functools import partial
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from core.choices import Scope
from core.errors import Conflict, Forbidden, NotFound, ValidationFailed
from core.models import Tenant
from core.principal import Principal
from core.residency import residency_of, residency_refusal, weights_of
from core.services.audit import audit_record
from core.services.validation import full_clean
from regions import hooks
from regions.choices import DeploymentState, PlacementMode, TargetRole, TargetStatus
from regions.models import Deployment, DeploymentEvent, DeploymentTarget, GpuPool
from regions.services import placement
from regions.tasks import reconcile_region
from registry import selectors as registry_selectors
from registry.engine_args import validate_engine_args
from registry.models import ModelVersion, RegisteredModel


def enqueue_reconcile(region_ids: set[int]) -> None:
    """Converge soon; the periodic pass catches anything this message misses."""
    for region_id in region_ids:
        transaction.on_commit(partial(reconcile_region.delay, region_id))


def resolve_version(model: RegisteredModel, version: str | None, alias: str) -> ModelVersion:
    if bool(version) == bool(alias):
        raise ValidationFailed("Give either a version to pin or an alias to follow.")
    if version:
        return registry_selectors.version_get(model, version)
    target = registry_selectors.alias_get(model, alias).version
    if target is None:
        raise Conflict(f"Alias '{alias}' of {model.ref} points at no version.", code="alias_empty")
    return target


def _check_model(owner: Tenant, model: RegisteredModel) -> None:
    if not registry_selectors.usable_by(model, owner):
        raise NotFound(f"{owner.slug} cannot use model {model.ref}.")


def _event(deployment: Deployment, kind: str, message: str, region: Any = None) -> None:
    DeploymentEvent.objects.create(deployment=deployment, region=region, kind=kind, message=message)


def deployment_create(
    *,
    actor: Principal,
    owner: Tenant,
    name: str,
    model: RegisteredModel,
    version: str | None = None,
    follow_alias: str = "",
    regions: list[str] | None = None,
    min_regions: int = 1,
    replicas: int = 1,
    gpu_type: str = "",
    gpu_count: int | None = None,
    engine_overrides: dict[str, Any] | None = None,
    shared: bool = False,
) -> Deployment:
    actor.require(Scope.DEPLOYMENTS_WRITE, owner.pk)
    if shared and not actor.sees_all(Scope.DEPLOYMENTS_WRITE):
        raise Forbidden(
            "Only platform operators run shared deployments.", detail={"scope": Scope.DEPLOYMENTS_WRITE}
        )
    if shared and model.owner_id is not None:
        raise ValidationFailed("A shared deployment serves a catalog model (one the platform owns).")
    _check_model(owner, model)
    resolved = resolve_version(model, version, follow_alias)
    placement.check_version_deployable(actor, resolved)
    overrides = validate_engine_args(engine_overrides or {}, field="engine_overrides")
    fit_type, fit_count = placement.fitting_gpu(resolved)
    gpu_type = gpu_type or fit_type
    if gpu_type == fit_type and (gpu_count or fit_count) < fit_count:
        raise ValidationFailed(f"{resolved} needs at least {fit_count} {gpu_type} GPUs per replica.")
    deployment = Deployment(
        owner=owner,
        name=name,
        model=model,
        version=resolved,
        follow_alias=follow_alias,
        placement_mode=PlacementMode.EXPLICIT if regions is not None else PlacementMode.POLICY,
        min_regions=min_regions,
        replicas=replicas,
        gpu_type=gpu_type,
        gpu_count=gpu_count or fit_count,
        engine_overrides=overrides,
        shared=shared,
        created_by_name=actor.name,
    )
    full_clean(deployment, exclude=["owner", "model", "version"])
    try:
        with transaction.atomic():
            return _admit_and_save(actor, deployment, regions)
    except IntegrityError as exc:
        raise Conflict(
            f"{owner.slug} already has a deployment named '{name}'.", code="already_exists"
        ) from exc


def _admit_and_save(actor: Principal, deployment: Deployment, explicit: list[str] | None) -> Deployment:
    # Lock the GPU pools of this type so two admissions cannot both take the last free GPUs.
    list(GpuPool.objects.select_for_update().filter(gpu_type=deployment.gpu_type).order_by("pk"))
    choices = list(placement.deployment_choices(deployment, deployment.replicas).values())
    chosen = placement.pick_regions(choices, explicit, deployment.min_regions)
    placement.check_quota(deployment.owner, deployment.replicas * deployment.gpu_count * len(chosen))
    deployment.save()
    for region in chosen:
        DeploymentTarget.objects.create(
            deployment=deployment, region=region, desired_replicas=deployment.replicas
        )
    codes = [r.code for r in chosen]
    _event(
        deployment,
        "created",
        f"{deployment.version} in {', '.join(codes)}, {deployment.replicas} replica(s) "
        f"of {deployment.gpu_count}× {deployment.gpu_type} each",
    )
    audit_record(
        actor=actor,
        action="deployment.created",
        target=deployment,
        tenant=deployment.owner,
        after={
            "version": str(deployment.version),
            "regions": codes,
            "replicas": deployment.replicas,
            "gpu_type": deployment.gpu_type,
            "gpu_count": deployment.gpu_count,
            "follow_alias": deployment.follow_alias,
        },
    )
    enqueue_reconcile({r.pk for r in chosen})
    return deployment


def deployment_scale(*, actor: Principal, deployment: Deployment, replicas: int) -> Deployment:
    """Set the replicas of every region; 0 pauses the deployment (its GPUs are released)."""
    actor.require(Scope.DEPLOYMENTS_WRITE, deployment.owner_id)
    _check_scalable(deployment)
    if replicas != 0 and not deployment.min_replicas <= replicas <= deployment.max_replicas:
        raise ValidationFailed(
            f"replicas must be 0 (pause) or between {deployment.min_replicas} and {deployment.max_replicas}."
        )
    with transaction.atomic():
        targets = _lock_serving_targets(deployment)
        _apply_replicas(
            actor,
            deployment,
            {t.region.code: replicas for t in targets},
            targets,
            action="deployment.scaled",
            message=f"{replicas} replica(s) per region" + (" (paused)" if replicas == 0 else ""),
        )
        Deployment.objects.filter(pk=deployment.pk).update(replicas=replicas)
        deployment.refresh_from_db()
    return deployment


MAX_FALLBACKS = 5


def deployment_set_fallbacks(*, actor: Principal, deployment: Deployment, fallbacks: list[str]) -> Deployment:
    """The model names tried, in order, when this deployment cannot serve a request. Each is another
    deployment (or shared model) name of the same caller; the gateway uses one only where the route
    table gives it compliant endpoints for that tenant, so a fallback never crosses residency."""
    actor.require(Scope.DEPLOYMENTS_WRITE, deployment.owner_id)
    names = _fallback_names(deployment, fallbacks)
    with transaction.atomic():
        before = list(deployment.fallbacks)
        Deployment.objects.filter(pk=deployment.pk).update(fallbacks=names, updated_at=timezone.now())
        deployment.refresh_from_db()
        audit_record(
            actor=actor,
            action="deployment.fallbacks_set",
            target=deployment,
            tenant=deployment.owner,
            before={"fallbacks": before},
            after={"fallbacks": names},
        )
        _event(deployment, "fallbacks", f"fallbacks: {', '.join(names) or 'none'}")
    return deployment


def _fallback_names(deployment: Deployment, fallbacks: list[str]) -> list[str]:
    if len(fallbacks) > MAX_FALLBACKS:
        raise ValidationFailed(f"At most {MAX_FALLBACKS} fallbacks.", detail={"fallbacks": ["Too many."]})
    if len(set(fallbacks)) != len(fallbacks) or deployment.name in fallbacks:
        raise ValidationFailed(
            "Fallbacks are other model names, each once.", detail={"fallbacks": ["Repeated or itself."]}
        )
    live = Deployment.objects.exclude(state=DeploymentState.DELETED)
    known = set(live.filter(owner=deployment.owner, name__in=fallbacks).values_list("name", flat=True))
    known |= set(live.filter(shared=True, name__in=fallbacks).values_list("name", flat=True))
    unknown = [name for name in fallbacks if name not in known]
    if unknown:
        raise ValidationFailed(
            f"No deployment named {', '.join(unknown)} serves {deployment.owner.slug}.",
            detail={"fallbacks": ["Unknown."]},
        )
    return list(fallbacks)


def targets_scale(
    *,
    actor: Principal,
    deployment: Deployment,
    replicas: dict[str, int],
    reason: str,
    kind: str,
    detail: dict[str, Any] | None = None,
    wakes_on_request: bool = False,
    overflow_of: str = "",
) -> Deployment:
    """Set the replicas of some regions (by code), each on its own: the autoscaler's and the gateway's
    activation's write path. A code the deployment is not in yet adds the region (scale-out), admitted
    by the same rules as a new deployment: residency, GPUs free, the tenant's quota; it takes the overflow
    of the region ``overflow_of``. ``wakes_on_request`` marks the regions as idle (at 0) or waking (woken
    by a held request) rather than paused: requests for them are held until they serve."""
    actor.require(Scope.DEPLOYMENTS_WRITE, deployment.owner_id)
    _check_scalable(deployment)
    for code, count in replicas.items():
        if not 0 <= count <= MAX_REPLICAS:
            raise ValidationFailed(f"replicas for {code} must be between 0 and {MAX_REPLICAS}.")
    with transaction.atomic():
        targets = _lock_serving_targets(deployment)
        targets += _add_regions(deployment, set(replicas) - {t.region.code for t in targets}, overflow_of)
        _apply_replicas(
            actor,
            deployment,
            replicas,
            targets,
            action="deployment.autoscaled",
            message=reason,
            kind=kind,
            detail=detail,
            wakes_on_request=wakes_on_request,
        )
        deployment.refresh_from_db()
    return deployment


MAX_REPLICAS = 64


def _check_residency(
    deployment: Deployment, targets: list[DeploymentTarget], replicas: dict[str, int]
) -> None:
    """No replica added where residency now refuses the deployment (narrowed since it was placed there:
    routing sends that region nothing, so what runs there may only shrink)."""
    weights, serving = weights_of(deployment.version), residency_of(deployment.owner)
    for target in targets:
        if replicas.get(target.region.code, 0) <= target.desired_replicas:
            continue
        refusal = residency_refusal(weights, target.region.jurisdiction, serving=serving)
        if refusal is not None:
            raise Conflict(f"{deployment} cannot grow in {target.region.code}: {refusal}.", code="residency")


def _check_scalable(deployment: Deployment) -> None:
    if deployment.state != DeploymentState.ACTIVE:
        raise Conflict(f"{deployment} is {deployment.state}.", code="not_active")
    if deployment.targets.filter(role=TargetRole.CANDIDATE).exists():
        raise Conflict(
            f"{deployment} is being rolled out; scale it once the rollout has ended.", code="rollout_active"
        )


def _lock_serving_targets(deployment: Deployment) -> list[DeploymentTarget]:
    """The targets that serve (not retiring, not deleted), with the GPU pools of their type locked so two
    scale-ups cannot both take the last free GPUs."""
    list(GpuPool.objects.select_for_update().filter(gpu_type=deployment.gpu_type).order_by("pk"))
    return list(
        deployment.targets.exclude(status=TargetStatus.DELETED)
        .exclude(role=TargetRole.RETIRING)
        .select_related("region")
    )


def _add_regions(deployment: Deployment, codes: set[str], overflow_of: str) -> list[DeploymentTarget]:
    if not codes:
        return []
    choices = placement.deployment_choices(deployment, replicas=0)
    added = []
    for code in sorted(codes):
        choice = choices.get(code)
        if choice is None:
            raise Conflict(f"There is no region '{code}'.", code="unknown_region")
        if not choice.eligible:
            raise Conflict(
                f"{deployment} cannot go to {code}: {'; '.join(choice.reasons)}.", code="region_not_eligible"
            )
        added.append(
            DeploymentTarget.objects.create(
                deployment=deployment, region=choice.region, desired_replicas=0, overflow_of=overflow_of
            )
        )
    return added


def _apply_replicas(
    actor: Principal,
    deployment: Deployment,
    replicas: dict[str, int],
    targets: list[DeploymentTarget],
    *,
    action: str,
    message: str,
    kind: str = "manual",
    detail: dict[str, Any] | None = None,
    wakes_on_request: bool = False,
) -> None:
    """Write the new counts (the GPU pools are locked by the caller), with one event and one audit entry."""
    changing = [t for t in targets if t.region.code in replicas]
    _check_residency(deployment, changing, replicas)
    _check_room(deployment, changing, replicas)
    before = {t.region.code: t.desired_replicas for t in changing}
    now = timezone.now()
    for target in changing:
        count = replicas[target.region.code]
        DeploymentTarget.objects.filter(pk=target.pk).update(
            desired_replicas=count, wakes_on_request=wakes_on_request, next_attempt_at=now
        )
    Deployment.objects.filter(pk=deployment.pk).update(generation=F("generation") + 1, updated_at=now)
    _event(deployment, "scaled", message)
    audit_record(
        actor=actor,
        action=action,
        target=deployment,
        tenant=deployment.owner,
        before=before,
        after={**{code: replicas[code] for code in before}, **({"detail": detail} if detail else {})},
    )
    scaled = {code: (count, replicas[code]) for code, count in before.items()}
    for listener in hooks.SCALE_LISTENERS:
        listener(hooks.Scaled(deployment, scaled, kind, message, detail or {}))
    enqueue_reconcile({t.region_id for t in changing})


def _check_room(deployment: Deployment, targets: list[DeploymentTarget], replicas: dict[str, int]) -> None:
    growth = {t.pk: max(0, replicas[t.region.code] - t.desired_replicas) for t in targets}
    if not any(growth.values()):
        return
    extra = sum(growth.values()) * deployment.gpu_count
    placement.check_quota(deployment.owner, extra, exclude=None)
    for target in targets:
        if not growth[target.pk]:
            continue
        pool = target.region.gpu_pools.filter(gpu_type=deployment.gpu_type).first()
        wanted = replicas[target.region.code] * deployment.gpu_count
        free = (pool.gpu_count if pool else 0) - placement.gpus_in_use(
            target.region, deployment.gpu_type, deployment
        )
        if wanted > free:
            raise Conflict(
                f"{target.region.code} has {free} {deployment.gpu_type} GPUs free; {wanted} needed.",
                code="no_capacity",
            )


def deployment_delete(*, actor: Principal, deployment: Deployment) -> Deployment:
    actor.require(Scope.DEPLOYMENTS_WRITE, deployment.owner_id)
    with transaction.atomic():
        moved = Deployment.objects.filter(pk=deployment.pk, state=DeploymentState.ACTIVE).update(
            state=DeploymentState.DELETING, generation=F("generation") + 1, updated_at=timezone.now()
        )
        if not moved:
            raise Conflict(f"{deployment} is already being deleted.", code="not_active")
        deployment.refresh_from_db()
        deployment.targets.exclude(status=TargetStatus.DELETED).update(next_attempt_at=timezone.now())
        _event(deployment, "deleting", "deletion requested")
        audit_record(
            actor=actor,
            action="deployment.deleted",
            target=deployment,
            tenant=deployment.owner,
            before={"state": "active"},
            after={"state": "deleting"},
        )
        enqueue_reconcile(set(deployment.targets.values_list("region_id", flat=True)))
    return deployment
