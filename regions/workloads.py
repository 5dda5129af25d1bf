"""What a deployment means in one region: the driver-neutral workload spec and its name."""

import re
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from regions import hooks
from regions.choices import DeploymentState, DriverKind, RegionStatus, TargetRole
from regions.drivers.base import WorkloadSpec
from regions.engine_keys import DEPLOYMENT_LABEL, key_fingerprint
from regions.models import Deployment, DeploymentTarget, GpuPool
from registry.choices import POOLING_TASKS
from registry.models import ModelVersion
from registry.selectors import version_files

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]")


def workload_name(deployment: Deployment, revision: int = 0) -> str:
    """Deterministic, so a retried or crashed reconcile finds what it created instead of duplicating it;
    one per revision, so a candidate runs beside the baseline and keeps its name when it is promoted."""
    base = f"cp-{deployment.pk}-{deployment.name}"
    if revision == 0:
        return base[:50].rstrip("-")
    suffix = f"-r{revision}"
    return base[: 50 - len(suffix)].rstrip("-") + suffix


def target_workload(target: DeploymentTarget) -> str:
    return workload_name(target.deployment, target.revision)


def target_version(target: DeploymentTarget) -> ModelVersion:
    """The version a target runs: its own (a candidate's, a retiring one's), else the deployment's."""
    return target.version or target.deployment.version


def removed(target: DeploymentTarget) -> bool:
    """A deployment being deleted, or a retiring revision whose drain is over: its workload goes."""
    if target.deployment.state != DeploymentState.ACTIVE:
        return True
    return target.role == TargetRole.RETIRING and (
        target.remove_after is None or target.remove_after <= timezone.now()
    )


def _label(value: str) -> str:
    return _LABEL_VALUE.sub("-", value)[:63].strip("-_.") or "none"


def effective_replicas(target: DeploymentTarget) -> int:
    if target.deployment.state != DeploymentState.ACTIVE or target.region.status == RegionStatus.DISABLED:
        return 0
    return target.desired_replicas


def _may_delegate(target: DeploymentTarget) -> bool:
    """Only a stable target (a candidate or a retiring revision is sized by its rollout) in a Kubernetes
    region may run under an in-cluster autoscaler; a disabled region or a deployment being deleted goes to
    zero whatever the policy says."""
    if target.role != TargetRole.STABLE or target.region.driver != DriverKind.KUBERNETES:
        return False
    return target.deployment.state == DeploymentState.ACTIVE and target.region.status != RegionStatus.DISABLED


@dataclass(frozen=True)
class SpecInputs:
    """What workload specs read besides their targets, fetched once for many targets: GPU pools by
    (region, GPU type), and the in-cluster scaler of each target whose policy delegates."""

    pools: dict[tuple[int, str], GpuPool]
    scalers: dict[int, dict[str, Any]]


def spec_inputs(targets: list[DeploymentTarget]) -> SpecInputs:
    pools: dict[tuple[int, str], GpuPool] = {}
    wanted = {(t.region_id, t.deployment.gpu_type) for t in targets}
    for pool in GpuPool.objects.filter(region_id__in={r for r, _ in wanted}).order_by("pk"):
        pools.setdefault((pool.region_id, pool.gpu_type), pool)
    return SpecInputs(pools, hooks.in_cluster_scalers([t for t in targets if _may_delegate(t)]))


def model_files(version: ModelVersion) -> list[list[str]]:
    """(relative path, sha256) of every file the engine needs, fetched by content address."""
    return [[f.path, f.sha256] for f in version_files(version)]


def runner_args(deployment: Deployment) -> dict[str, str]:
    """An embedding, reranking or classification model runs on vLLM's pooling runner (every version of a
    deployment is of its model)."""
    return {"runner": "pooling"} if deployment.model.task in POOLING_TASKS else {}


def workload_spec(target: DeploymentTarget, inputs: SpecInputs | None = None) -> WorkloadSpec:
    """What the target should run. ``inputs``: fetched for a whole pass (``spec_inputs``), else now."""
    inputs = inputs or spec_inputs([target])
    deployment, version = target.deployment, target_version(target)
    pool = inputs.pools.get((target.region_id, deployment.gpu_type))
    return WorkloadSpec(
        name=target_workload(target),
        labels={
            "controlplane.io/tenant": _label(deployment.owner.slug),
            "controlplane.io/model": _label(deployment.model.name),
            "controlplane.io/version": _label(version.version),
            DEPLOYMENT_LABEL: str(deployment.pk),
            "controlplane.io/revision": str(target.revision),
        },
        replicas=effective_replicas(target),
        served_model_name=version.served_model_name,
        model_uri=version.artifact_uri,
        runtime_image=version.runtime_image,
        engine_args={**runner_args(deployment), **version.engine_args, **deployment.engine_overrides},
        gpu_type=deployment.gpu_type,
        gpu_count=deployment.gpu_count,
        model_store=dict(target.region.object_store),
        model_files=model_files(version) if target.region.object_store else [],
        node_labels=dict(pool.node_labels) if pool else {},
        taints=list(pool.taints) if pool else [],
        artifact_bytes=version.artifact_size_bytes,
        scaler=inputs.scalers.get(target.pk, {}),
        api_key_id=key_fingerprint(deployment.pk),
    )
