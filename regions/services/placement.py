"""Admission: which regions a deployment may go to, and why the others are excluded.

A region qualifies when it is active, residency allows the version to be served there to the tenant
(``core.residency``), and its GPU pool has room. Residency is never traded for
capacity: a deployment with no compliant region is refused, not placed elsewhere.
"""

from dataclasses import dataclass, field

from core.errors import Conflict
from core.models import Tenant
from core.principal import Principal
from core.residency import residency_of, residency_refusal, weights_of
from regions.choices import RegionStatus
from regions.models import Deployment, Region
from regions.selectors import gpus_in_use, tenant_gpus_in_use
from registry.models import ModelVersion
from registry.selectors import deployable_states
from registry.sizing import sizing_of


@dataclass
class RegionChoice:
    region: Region
    reasons: list[str] = field(default_factory=list)
    free_gpus: int = 0

    @property
    def eligible(self) -> bool:
        return not self.reasons


def check_version_deployable(actor: Principal, version: ModelVersion) -> None:
    allowed = deployable_states(actor)
    if version.status not in allowed:
        raise Conflict(
            f"{version} is {version.status}; deployable versions are {', '.join(sorted(allowed))}.",
            code="version_not_deployable",
        )


def default_gpu(version: ModelVersion, regions: list[Region]) -> tuple[str, int]:
    """The smallest fitting GPU type that some candidate region has, and how many a replica needs."""
    available = {pool.gpu_type for region in regions for pool in region.gpu_pools.all()}
    sizing = sizing_of(version)
    for fit in sizing["fits"]:
        if fit["gpu_type"] in available:
            return fit["gpu_type"], fit["gpu_count"]
    raise Conflict(
        f"No region has a GPU type that fits {version} (needs about {sizing['total_gib']} GiB).",
        code="no_capacity",
    )


def fitting_gpu(version: ModelVersion) -> tuple[str, int]:
    """``default_gpu`` over every region: the GPU a replica of ``version`` gets unless one is named."""
    return default_gpu(version, list(Region.objects.prefetch_related("gpu_pools")))


@dataclass
class Preview:
    """Where a deployment would go: the GPU per replica, and every region with why it is excluded."""

    gpu_type: str
    gpu_count: int
    choices: list[RegionChoice]


def placement_preview(*, tenant: Tenant, version: ModelVersion, replicas: int) -> Preview:
    """The placement preview the API and the console show (a Conflict when no region has a fitting GPU)."""
    gpu_type, gpu_count = fitting_gpu(version)
    choices = region_choices(
        tenant=tenant, version=version, gpu_type=gpu_type, gpu_count=gpu_count, replicas=replicas
    )
    return Preview(gpu_type, gpu_count, choices)


def region_choices(
    *,
    tenant: Tenant,
    version: ModelVersion,
    gpu_type: str,
    gpu_count: int,
    replicas: int,
    exclude: Deployment | None = None,
) -> list[RegionChoice]:
    choices = []
    weights, serving = weights_of(version), residency_of(tenant)
    for region in Region.objects.prefetch_related("gpu_pools").order_by("code"):
        choice = RegionChoice(region)
        if region.status != RegionStatus.ACTIVE:
            choice.reasons.append(f"region is {region.status}")
        refusal = residency_refusal(weights, region.jurisdiction, serving=serving)
        if refusal is not None:
            choice.reasons.append(refusal)
        pool = next((p for p in region.gpu_pools.all() if p.gpu_type == gpu_type), None)
        if pool is None:
            choice.reasons.append(f"no {gpu_type} GPUs in this region")
        else:
            choice.free_gpus = pool.gpu_count - gpus_in_use(region, gpu_type, exclude)
            if replicas * gpu_count > choice.free_gpus:
                choice.reasons.append(
                    f"needs {replicas * gpu_count} {gpu_type} GPUs, {choice.free_gpus} free"
                )
        choices.append(choice)
    return choices


def deployment_choices(
    deployment: Deployment, replicas: int, exclude: Deployment | None = None
) -> dict[str, RegionChoice]:
    """Region code → whether (and why not) it can take ``replicas`` more of the deployment's replicas."""
    choices = region_choices(
        tenant=deployment.owner,
        version=deployment.version,
        gpu_type=deployment.gpu_type,
        gpu_count=deployment.gpu_count,
        replicas=replicas,
        exclude=exclude,
    )
    return {choice.region.code: choice for choice in choices}


def check_quota(tenant: Tenant, extra_gpus: int, exclude: Deployment | None = None) -> None:
    if tenant.max_gpus is None:
        return
    used = tenant_gpus_in_use(tenant, exclude)
    if used + extra_gpus > tenant.max_gpus:
        raise Conflict(
            f"{tenant.slug} would use {used + extra_gpus} GPUs; its quota is {tenant.max_gpus} "
            f"({used} in use).",
            code="over_quota",
        )


def pick_regions(choices: list[RegionChoice], explicit: list[str] | None, min_regions: int) -> list[Region]:
    by_code = {c.region.code: c for c in choices}
    if explicit is not None:
        for code in explicit:
            choice = by_code.get(code)
            if choice is None:
                raise Conflict(f"No region '{code}'.", code="unknown_region")
            if not choice.eligible:
                raise Conflict(
                    f"Region {code} cannot take this deployment: {'; '.join(choice.reasons)}.",
                    code="region_not_eligible",
                    detail={code: choice.reasons},
                )
        return [by_code[code].region for code in explicit]
    eligible = [c.region for c in choices if c.eligible]
    if len(eligible) < min_regions:
        excluded = {c.region.code: c.reasons for c in choices if not c.eligible}
        why = "; ".join(f"{code}: {', '.join(reasons)}" for code, reasons in excluded.items())
        raise Conflict(
            f"Only {len(eligible)} region(s) can take this deployment, {min_regions} required. "
            f"Excluded: {why}.",
            code="not_enough_regions",
            detail=excluded,
        )
    return eligible
