"""Setting, reading and removing a deployment's autoscaling policy: one service for API, console, CLI."""

from typing import Any

from django.db import transaction
from django.utils import timezone

from autoscaling.choices import ScalerMode
from autoscaling.kubernetes import check_mode
from autoscaling.models import AutoscalingPolicy, ScalerState
from autoscaling.policy import Policy, parse, parse_overrides
from core.choices import Scope
from core.errors import NotFound, ValidationFailed
from core.principal import Principal
from core.services.audit import audit_record
from regions.choices import TargetRole, TargetStatus
from regions.models import Deployment, Region


def _serving_regions(deployment: Deployment) -> list[Region]:
    return list(
        Region.objects.filter(
            targets__in=deployment.targets.exclude(status=TargetStatus.DELETED).exclude(
                role=TargetRole.RETIRING
            )
        ).distinct()
    )


def _regions(deployment: Deployment) -> set[str]:
    return {region.code for region in _serving_regions(deployment)}


def _check_quota(deployment: Deployment, policies: list[Policy]) -> None:
    """A policy may not plan beyond the tenant's GPU quota: one region at its max must fit in it."""
    quota = deployment.owner.max_gpus
    biggest = max(p.max_replicas for p in policies)
    if quota is not None and biggest * deployment.gpu_count > quota:
        raise ValidationFailed(
            f"max_replicas {biggest} × {deployment.gpu_count} GPU(s) is more than {deployment.owner.slug}'s "
            f"GPU quota of {quota}.",
            detail={"field": "max_replicas"},
        )


def validated(deployment: Deployment, raw: Any) -> tuple[str, bool, dict[str, Any], dict[str, Any]]:
    """(mode, enabled, spec, overrides) from a request body, or 400 naming the field."""
    if not isinstance(raw, dict):
        raise ValidationFailed("The policy must be a JSON object.", detail={"field": "policy"})
    body = dict(raw)
    mode = body.pop("mode", ScalerMode.CONTROL_PLANE)
    if mode not in ScalerMode.values:
        raise ValidationFailed(
            f"mode must be one of {', '.join(ScalerMode.values)}.", detail={"field": "mode"}
        )
    enabled = body.pop("enabled", True)
    if not isinstance(enabled, bool):
        raise ValidationFailed("enabled must be true or false.", detail={"field": "enabled"})
    overrides_raw = body.pop("overrides", {})
    spec = parse(body)
    overrides = parse_overrides(overrides_raw, spec, _regions(deployment))
    regional = [parse(fields, base=spec) for fields in overrides.values()]
    _check_quota(deployment, [spec, *regional])
    check_mode(mode=mode, spec=spec.as_dict(), overrides=overrides, regions=_serving_regions(deployment))
    return mode, enabled, spec.as_dict(), overrides


def policy_get(principal: Principal, deployment: Deployment) -> AutoscalingPolicy:
    principal.require(Scope.DEPLOYMENTS_READ, deployment.owner_id)
    found = AutoscalingPolicy.objects.filter(deployment=deployment).first()
    if found is None:
        raise NotFound(f"{deployment} has no autoscaling policy.")
    return found


def policy_set(*, actor: Principal, deployment: Deployment, body: Any) -> AutoscalingPolicy:
    """Create or replace the policy (a PUT: fields not given take their defaults)."""
    actor.require(Scope.DEPLOYMENTS_WRITE, deployment.owner_id)
    mode, enabled, spec, overrides = validated(deployment, body)
    with transaction.atomic():
        existing = AutoscalingPolicy.objects.select_for_update().filter(deployment=deployment).first()
        before = _shape(existing) if existing else None
        policy, _ = AutoscalingPolicy.objects.update_or_create(
            deployment=deployment,
            defaults={
                "mode": mode,
                "enabled": enabled,
                "spec": spec,
                "overrides": overrides,
                "updated_by_name": actor.name,
                "updated_at": timezone.now(),
            },
        )
        audit_record(
            actor=actor,
            action="autoscaling.policy_set",
            target=deployment,
            tenant=deployment.owner,
            before=before,
            after=_shape(policy),
        )
        # The in-cluster scaler (mode hpa/keda) is part of the workload: the reconciler re-applies it.
        deployment.targets.exclude(status=TargetStatus.DELETED).update(next_attempt_at=timezone.now())
        if not enabled or mode != ScalerMode.CONTROL_PLANE:
            _forget_limits(deployment)
    return policy


def policy_delete(*, actor: Principal, deployment: Deployment) -> None:
    """Stop autoscaling: the replicas stay where they are, the decisions stay in the log."""
    actor.require(Scope.DEPLOYMENTS_WRITE, deployment.owner_id)
    with transaction.atomic():
        policy = AutoscalingPolicy.objects.select_for_update().filter(deployment=deployment).first()
        if policy is None:
            raise NotFound(f"{deployment} has no autoscaling policy.")
        before = _shape(policy)
        policy.delete()
        audit_record(
            actor=actor,
            action="autoscaling.policy_deleted",
            target=deployment,
            tenant=deployment.owner,
            before=before,
            after=None,
        )
        deployment.targets.exclude(status=TargetStatus.DELETED).update(next_attempt_at=timezone.now())
        _forget_limits(deployment)


def _forget_limits(deployment: Deployment) -> None:
    """Nothing evaluates the deployment any more: a capacity limit the last pass met is no longer true."""
    ScalerState.objects.filter(target__deployment=deployment).exclude(limited="").update(limited="")


def _shape(policy: AutoscalingPolicy) -> dict[str, Any]:
    return {
        "mode": policy.mode,
        "enabled": policy.enabled,
        "spec": policy.spec,
        "overrides": policy.overrides,
    }
