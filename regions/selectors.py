"""Reads of regions and deployments, narrowed to what the principal may see.

Regions are shared infrastructure: anyone with ``deployments:read`` somewhere sees them (tenants need to
know where they may deploy); their driver configuration is shown to operators only.
"""

from django.db.models import Q, QuerySet, Sum

from controlplane.choices import Scope
from controlplane.errors import Forbidden, NotFound
from controlplane.models import Tenant
from controlplane.principal import Principal
from controlplane.selectors import scoped
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
