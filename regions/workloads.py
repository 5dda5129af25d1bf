"""What a deployment means in one region: the driver-neutral workload spec and its name."""

import re

from regions.choices import DeploymentState, RegionStatus
from regions.drivers.base import WorkloadSpec
from regions.models import Deployment, DeploymentTarget, GpuPool
from registry.models import ModelVersion
from registry.selectors import version_files

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]")


def workload_name(deployment: Deployment) -> str:
    """Deterministic, so a retried or crashed reconcile finds what it created instead of duplicating it."""
    return f"cp-{deployment.pk}-{deployment.name}"[:50].rstrip("-")


def _label(value: str) -> str:
    return _LABEL_VALUE.sub("-", value)[:63].strip("-_.") or "none"


def effective_replicas(target: DeploymentTarget) -> int:
    if target.deployment.state != DeploymentState.ACTIVE or target.region.status == RegionStatus.DISABLED:
        return 0
    return target.desired_replicas


def model_files(version: ModelVersion) -> list[list[str]]:
    """(relative path, sha256) of every file the engine needs, fetched by content address."""
    return [[f.path, f.sha256] for f in version_files(version)]


def workload_spec(target: DeploymentTarget) -> WorkloadSpec:
    deployment, version = target.deployment, target.deployment.version
    pool = GpuPool.objects.filter(region=target.region, gpu_type=deployment.gpu_type).first()
    return WorkloadSpec(
        name=workload_name(deployment),
        labels={
            "controlplane.io/tenant": _label(deployment.owner.slug),
            "controlplane.io/model": _label(deployment.model.name),
            "controlplane.io/version": _label(version.version),
            "controlplane.io/deployment": str(deployment.pk),
        },
        replicas=effective_replicas(target),
        served_model_name=version.served_model_name,
        model_uri=version.artifact_uri,
        runtime_image=version.runtime_image,
        engine_args={**version.engine_args, **deployment.engine_overrides},
        gpu_type=deployment.gpu_type,
        gpu_count=deployment.gpu_count,
        model_store=dict(target.region.object_store),
        model_files=model_files(version) if target.region.object_store else [],
        node_labels=dict(pool.node_labels) if pool else {},
        taints=list(pool.taints) if pool else [],
        artifact_bytes=version.artifact_size_bytes,
    )
