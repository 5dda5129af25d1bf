"""Reads of regions and deployments, narrowed to what the principal may see.

Regions are shared infrastructure: anyone with ``deployments:read`` somewhere sees them (tenants need to
know where they may deploy); their driver configuration is shown to operators only.
"""

from typing import Any

from django.db.models import Q, QuerySet, Sum

from core.choices import Scope
from core.errors import Forbidden, NotFound
from core.models import Tenant
from core.principal import Principal
from core.residency import processing_refusal, residency_of
from core.selectors import scoped
from regions.choices import DeploymentState, TargetStatus
from regions.models import Deployment, DeploymentTarget, Region


def regions_for(principal: Principal) -> QuerySet[Region]:
    if Scope.DEPLOYMENTS_READ not in principal.all_scopes:
        raise Forbidden("Reading regions needs the 'deployments:read' permission.")
    return Region.objects.prefetch_related("gpu_pools")


def region_get(principal: Principal, code: str) -> Region:
    region = regions_for(principal).filter(code=code).first()
    if region is None:
        raise NotFound(f"No region '{code}'.")
    return region


def deployments_for(principal: Principal) -> QuerySet[Deployment]:
    queryset = Deployment.objects.select_related("owner", "model__owner", "version").exclude(
        state=DeploymentState.DELETED
    )
    return scoped(queryset, principal, Scope.DEPLOYMENTS_READ, field="owner")


def deployment_get(principal: Principal, owner: str, name: str) -> Deployment:
    deployment = deployments_for(principal).filter(owner__slug=owner, name=name).first()
    if deployment is None:
        raise NotFound(f"No deployment '{owner}/{name}'.")
    return deployment


LIVE_TARGETS = Q(deployment__state=DeploymentState.ACTIVE) & ~Q(status=TargetStatus.DELETED)


def gpus_in_use(region: Region, gpu_type: str, exclude: Deployment | None = None) -> int:
    targets = DeploymentTarget.objects.filter(LIVE_TARGETS, region=region, deployment__gpu_type=gpu_type)
    if exclude is not None:
        targets = targets.exclude(deployment=exclude)
    return _gpu_sum(targets)


def tenant_gpus_in_use(tenant: Tenant, exclude: Deployment | None = None) -> int:
    targets = DeploymentTarget.objects.filter(LIVE_TARGETS, deployment__owner=tenant)
    if exclude is not None:
        targets = targets.exclude(deployment=exclude)
    return _gpu_sum(targets)


def _gpu_sum(targets: QuerySet[DeploymentTarget]) -> int:
    from django.db.models import F

    total = targets.aggregate(gpus=Sum(F("desired_replicas") * F("deployment__gpu_count")))["gpus"]
    return int(total or 0)


# What one deployment looks like across its regions, worst first: one failed region makes it failed.
ROLLUP = (
    (TargetStatus.FAILED, "failed"),
    (TargetStatus.DEGRADED, "degraded"),
    (TargetStatus.PENDING, "starting"),
    (TargetStatus.WAITING, "starting"),
    (TargetStatus.PROVISIONING, "starting"),
    (TargetStatus.READY, "ready"),
    (TargetStatus.PAUSED, "paused"),
)
ROLLUP_STATES = ("ready", "degraded", "failed", "starting", "paused")


def deployment_states(principal: Principal) -> dict[str, int]:
    """How many visible active deployments are ready, degraded, failed, starting or paused."""
    statuses: dict[int, set[str]] = {}
    targets = DeploymentTarget.objects.filter(LIVE_TARGETS, deployment__in=deployments_for(principal))
    for deployment_id, status in targets.values_list("deployment_id", "status"):
        statuses.setdefault(deployment_id, set()).add(status)
    counts = dict.fromkeys(ROLLUP_STATES, 0)
    for found in statuses.values():
        counts[next((state for status, state in ROLLUP if status in found), "starting")] += 1
    return counts


def troubled_targets(principal: Principal) -> QuerySet[DeploymentTarget]:
    """Visible deployments' regions that are failed or degraded, newest trouble first (the alerts)."""
    return (
        DeploymentTarget.objects.filter(LIVE_TARGETS, deployment__in=deployments_for(principal))
        .filter(status__in=[TargetStatus.FAILED, TargetStatus.DEGRADED])
        .select_related("deployment__owner", "region")
        .order_by("-last_transition_at")
    )


def fleet_capacity(principal: Principal) -> list[dict[str, Any]]:
    """GPUs per region and pool. Operators see the pool's use by everyone and what is free; a tenant
    member sees the pool's size and only their own tenants' GPUs in it (others' use is not theirs)."""
    mine = None if principal.sees_all(Scope.DEPLOYMENTS_READ) else deployments_for(principal)
    rows = []
    for region in regions_for(principal):
        for pool in region.gpu_pools.all():
            targets = DeploymentTarget.objects.filter(
                LIVE_TARGETS, region=region, deployment__gpu_type=pool.gpu_type
            )
            used = _gpu_sum(targets if mine is None else targets.filter(deployment__in=mine))
            free = max(pool.gpu_count - used, 0) if mine is None else None
            rows.append(
                {
                    "region": region,
                    "gpu_type": pool.gpu_type,
                    "total": pool.gpu_count,
                    "used": used,
                    "free": free,
                }
            )
    return rows


def region_jurisdictions() -> dict[str, str]:
    return dict(Region.objects.values_list("code", "jurisdiction"))


def processing_regions(tenant: Tenant, places: dict[str, str] | None = None) -> frozenset[str]:
    """The regions where the tenant's data may be processed: those whose jurisdiction its residency allows
    (``core.residency``). A gateway holds or works on a tenant's data (its indexes, its secrets, a
    pipeline's own stages) only when every region it serves is one of them. ``places``: every region's
    jurisdiction, when the caller read them once for many tenants."""
    residency = residency_of(tenant)
    places = region_jurisdictions() if places is None else places
    return frozenset(
        code for code, jurisdiction in places.items() if processing_refusal(residency, jurisdiction) is None
    )


def gateway_refusal(tenant: Tenant, gateway_regions: frozenset[str]) -> str | None:
    """Why a gateway serving ``gateway_regions`` may not hold the tenant's data; None when it may (a gateway
    of every region, ``frozenset()``, may: it is placed by the operator for everyone)."""
    outside = sorted(gateway_regions - processing_regions(tenant))
    if outside:
        return f"{tenant.slug}'s data may not be processed in {', '.join(outside)} (its residency)"
    return None
