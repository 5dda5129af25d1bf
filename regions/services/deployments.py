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
from core.services.audit import audit_record
from core.services.validation import full_clean
from regions.choices import DeploymentState, PlacementMode, TargetRole, TargetStatus
from regions.models import Deployment, DeploymentEvent, DeploymentTarget, GpuPool
from regions.services import placement
from regions.tasks import reconcile_region
from registry import selectors as registry_selectors
from registry.choices import Visibility
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
    if model.owner_id != owner.pk and not (model.owner_id is None and model.visibility == Visibility.CATALOG):
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
    choices = placement.region_choices(
        tenant=deployment.owner,
        version=deployment.version,
        gpu_type=deployment.gpu_type,
        gpu_count=deployment.gpu_count,
        replicas=deployment.replicas,
    )
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
    if deployment.state != DeploymentState.ACTIVE:
        raise Conflict(f"{deployment} is {deployment.state}.", code="not_active")
    if deployment.targets.filter(role=TargetRole.CANDIDATE).exists():
        raise Conflict(
            f"{deployment} is being rolled out; scale it once the rollout has ended.", code="rollout_active"
        )
    if replicas != 0 and not deployment.min_replicas <= replicas <= deployment.max_replicas:
        raise ValidationFailed(
            f"replicas must be 0 (pause) or between {deployment.min_replicas} and {deployment.max_replicas}."
        )
    with transaction.atomic():
        list(GpuPool.objects.select_for_update().filter(gpu_type=deployment.gpu_type).order_by("pk"))
        targets = list(
            deployment.targets.exclude(status=TargetStatus.DELETED)
            .exclude(role=TargetRole.RETIRING)
            .select_related("region")
        )
        _check_room(deployment, targets, replicas)
        before = {t.region.code: t.desired_replicas for t in targets}
        DeploymentTarget.objects.filter(pk__in=[t.pk for t in targets]).update(
            desired_replicas=replicas, next_attempt_at=timezone.now()
        )
        Deployment.objects.filter(pk=deployment.pk).update(
            replicas=replicas, generation=F("generation") + 1, updated_at=timezone.now()
        )
        deployment.refresh_from_db()
        _event(
            deployment, "scaled", f"{replicas} replica(s) per region" + (" (paused)" if replicas == 0 else "")
        )
        audit_record(
            actor=actor,
            action="deployment.scaled",
            target=deployment,
            tenant=deployment.owner,
            before=before,
            after={code: replicas for code in before},
        )
        enqueue_reconcile({t.region_id for t in targets})
    return deployment


def _check_room(deployment: Deployment, targets: list[DeploymentTarget], replicas: int) -> None:
    growth = sum(max(0, replicas - t.desired_replicas) for t in targets) * deployment.gpu_count
    if growth == 0:
        return
    placement.check_quota(
        deployment.owner, replicas * deployment.gpu_count * len(targets), exclude=deployment
    )
    for target in targets:
        pool = target.region.gpu_pools.filter(gpu_type=deployment.gpu_type).first()
        free = (pool.gpu_count if pool else 0) - placement.gpus_in_use(
            target.region, deployment.gpu_type, deployment
        )
        if replicas * deployment.gpu_count > free:
            raise Conflict(
                f"{target.region.code} has {free} {deployment.gpu_type} GPUs free; "
                f"{replicas * deployment.gpu_count} needed.",
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
