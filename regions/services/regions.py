"""Regions: registering them with their GPU pools, and draining or disabling them."""

from typing import Any

from django.db import transaction

from core.choices import Scope
from core.errors import Conflict, ValidationFailed
from core.principal import Principal
from core.services.audit import audit_record, snapshot
from core.services.validation import full_clean
from regions.choices import Certification, DeploymentState, RegionStatus
from regions.drivers.factory import validate_driver_config
from regions.models import DeploymentEvent, GpuPool, Region
from regions.services.deployments import enqueue_reconcile
from regions.services.fleet import placements_follow

REGION_FIELDS = ("code", "name", "provider", "city", "jurisdiction", "certifications", "status", "driver")
STATUS_NOTES: dict[str, str] = {
    RegionStatus.DRAINING: "region is draining: placed by policy, it is re-placed in another compliant "
    "region before leaving this one; placed in explicit regions, re-place it yourself",
    RegionStatus.DISABLED: "region disabled: replicas are stopped",
    RegionStatus.ACTIVE: "region active again",
}
POOL_KEYS = {"gpu_type", "memory_gib", "gpu_count", "node_labels", "taints"}


def _pools(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise ValidationFailed("gpu_pools must be a list.")
    for index, pool in enumerate(raw):
        if (
            not isinstance(pool, dict)
            or set(pool) - POOL_KEYS
            or not {"gpu_type", "memory_gib", "gpu_count"} <= set(pool)
        ):
            raise ValidationFailed(
                f"gpu_pools[{index}] needs gpu_type, memory_gib, gpu_count "
                f"(and optionally node_labels, taints)."
            )
    return raw


def region_create(
    *, actor: Principal, gpu_pools: list[dict[str, Any]] | None = None, **fields: Any
) -> Region:
    actor.require(Scope.REGIONS_WRITE)
    region = Region(**fields)
    full_clean(region)
    unknown = set(region.certifications) - set(Certification.values)
    if unknown:
        raise ValidationFailed(f"Unknown certification(s): {', '.join(sorted(unknown))}.")
    validate_driver_config(region.driver, region.driver_config, region.code)
    pools = _pools(gpu_pools or [])
    with transaction.atomic():
        if Region.objects.filter(code=region.code).exists():
            raise Conflict(f"Region {region.code} already exists.", code="already_exists")
        region.save()
        for pool in pools:
            candidate = GpuPool(region=region, **pool)
            full_clean(candidate, exclude=["region"])
            candidate.save()
        audit_record(
            actor=actor,
            action="region.created",
            target=region,
            after={**snapshot(region, REGION_FIELDS), "gpu_pools": pools},
        )
    placements_follow(f"region {region.code} added")
    return region


def region_set_status(*, actor: Principal, region: Region, status: str, reason: str = "") -> Region:
    """Drain (no new placements), disable or activate; deployments placed by policy follow (fleet.py)."""
    actor.require(Scope.REGIONS_WRITE)
    if status not in RegionStatus.values:
        raise ValidationFailed(f"Unknown region status '{status}'.")
    with transaction.atomic():
        previous = region.status
        if not Region.objects.filter(pk=region.pk, status=previous).update(status=status):
            raise Conflict(f"Region {region.code} changed meanwhile; reload and retry.")
        region.status = status
        affected = region.targets.filter(deployment__state=DeploymentState.ACTIVE).select_related(
            "deployment"
        )
        for target in affected:
            note = STATUS_NOTES[status]
            DeploymentEvent.objects.create(
                deployment=target.deployment, region=region, kind="region", message=note
            )
        audit_record(
            actor=actor,
            action="region.status_changed",
            target=region,
            message=reason,
            before={"status": previous},
            after={"status": status},
        )
        affected.update(next_attempt_at=region.created_at)
        enqueue_reconcile({region.pk})
    placements_follow(f"region {region.code} {status}")
    return region
