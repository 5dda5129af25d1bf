"""Delegating a deployment's scaling, in its Kubernetes regions, to the autoscaler the cluster runs.

A policy in mode ``hpa`` or ``keda`` is rendered, per Kubernetes region and from that region's effective
policy, into the driver-neutral description ``WorkloadSpec.scaler`` (its keys are documented in
``regions.drivers.kubernetes_scaling``, which renders the HorizontalPodAutoscaler or ScaledObject). The
driver then stops applying ``replicas`` and the reconciler stops comparing them, so the two never fight.
In the deployment's other regions the control plane's own autoscaler keeps sizing it (``delegated``).
"""

from collections.abc import Iterable
from typing import Any

from autoscaling.choices import ScalerMode
from autoscaling.models import AutoscalingPolicy
from autoscaling.policy import METRICS, Policy, effective
from core.errors import ValidationFailed
from regions.choices import DriverKind
from regions.models import DeploymentTarget, Region

DELEGATED_MODES = (ScalerMode.HPA, ScalerMode.KEDA)
QUANTILES = {"ttft_p95_seconds": 0.95}  # targets on a histogram: the quantile, not a per-replica share


def delegated(mode: str, region: Region) -> bool:
    """Whether a policy in this mode is carried out inside this region's cluster, not by the control
    plane's autoscaler (which must then leave that region of the deployment alone)."""
    return mode in DELEGATED_MODES and region.driver == DriverKind.KUBERNETES


def _metric(signal: str, target: float) -> dict[str, Any]:
    metric: dict[str, Any] = {"name": METRICS[signal], "target": target}
    if signal in QUANTILES:
        metric["quantile"] = QUANTILES[signal]
    return metric


def scaler_spec(policy: Policy, mode: str, prometheus_url: str = "") -> dict[str, Any]:
    """One region's effective policy as the in-cluster scaler to render (``WorkloadSpec.scaler``). The
    policy's tolerance is not carried: per-object tolerance is a beta HPA field behind a feature gate, so
    the cluster's own (10 % by default) applies."""
    scaler: dict[str, Any] = {
        "kind": mode,
        "min_replicas": policy.min_replicas,
        "max_replicas": policy.max_replicas,
        "metrics": [_metric(signal, target) for signal, target in policy.targets().items()],
        "window_seconds": policy.window_seconds,
        "scale_up": {
            "stabilization_seconds": policy.scale_up_stabilization_seconds,
            "percent": policy.scale_up_percent,
            "replicas": policy.scale_up_replicas,
            "period_seconds": policy.scale_up_period_seconds,
        },
        "scale_down": {
            "stabilization_seconds": policy.scale_down_stabilization_seconds,
            "replicas": policy.scale_down_replicas,
            "period_seconds": policy.scale_down_period_seconds,
        },
        "idle_seconds": policy.idle_seconds,
    }
    if mode == ScalerMode.KEDA:  # only KEDA queries Prometheus itself; an HPA reads the metrics API
        scaler["prometheus_url"] = prometheus_url
    return scaler


def in_cluster_scalers(targets: list[DeploymentTarget]) -> dict[int, dict[str, Any]]:
    """``regions.hooks.on_in_cluster_scaler``: the scaler each stable target in a Kubernetes region runs
    under when its deployment's policy is enabled and delegates (targets sized by the control plane are
    left out). One query, however many targets."""
    policies = {
        policy.deployment_id: policy
        for policy in AutoscalingPolicy.objects.filter(
            deployment_id__in={target.deployment_id for target in targets},
            enabled=True,
            mode__in=DELEGATED_MODES,
        )
    }
    scalers = {}
    for target in targets:
        policy = policies.get(target.deployment_id)
        if policy is not None:
            region = target.region
            policy_here = effective(policy.spec, policy.overrides, region.code)
            scalers[target.pk] = scaler_spec(policy_here, policy.mode, region.prometheus_url)
    return scalers


def check_mode(
    *, mode: str, spec: dict[str, Any], overrides: dict[str, dict[str, Any]], regions: Iterable[Region]
) -> None:
    """What delegating asks of the policy and of the regions it runs in, checked when a policy is saved:
    ValidationFailed naming the field otherwise. ``regions``: where the deployment runs. Policies in mode
    control_plane pass; the policy's own fields are validated by ``autoscaling.policy``."""
    if mode not in DELEGATED_MODES:
        return
    regions = list(regions)
    clusters = [region for region in regions if region.driver == DriverKind.KUBERNETES]
    if not clusters:
        where = ", ".join(sorted(region.code for region in regions)) or "no region yet"
        raise ValidationFailed(
            f"mode {mode} hands scaling to a Kubernetes cluster, and this deployment runs in no Kubernetes "
            f"region ({where}); use control_plane.",
            detail={"field": "mode"},
        )
    for region in clusters:
        _check_region(mode, effective(spec, overrides, region.code), region, overrides.get(region.code, {}))


def _check_region(mode: str, policy: Policy, region: Region, override: dict[str, Any]) -> None:
    def refuse(field: str, message: str) -> ValidationFailed:
        where = f"overrides.{region.code}." if field in override else ""
        return ValidationFailed(f"{where}{message}", detail={"field": field, "region": region.code})

    if mode == ScalerMode.HPA and policy.ttft_p95_seconds is not None:
        raise refuse(
            "ttft_p95_seconds",
            f"ttft_p95_seconds cannot be handed to an HPA in {region.code}: a latency quantile is not a "
            "per-pod metric a Prometheus adapter can serve it as; use keda (a histogram_quantile trigger) "
            "or control_plane.",
        )
    if mode == ScalerMode.HPA and policy.min_replicas == 0:
        raise refuse(
            "min_replicas",
            f"min_replicas 0 cannot be handed to an HPA in {region.code}: it keeps at least one replica "
            "(scaling to zero needs an alpha feature gate); use control_plane to scale to zero.",
        )
    if mode == ScalerMode.KEDA and policy.min_replicas == 0:
        raise refuse(
            "min_replicas",
            f"min_replicas 0 cannot be handed to KEDA in {region.code}: its triggers read vLLM's metrics, "
            "which vanish with the last replica, so it would never wake; use control_plane, whose "
            "deployments at zero are woken by requests held at the gateway.",
        )
    if mode == ScalerMode.KEDA and not region.prometheus_url:
        raise ValidationFailed(
            f"mode keda needs a Prometheus for KEDA to query, and region {region.code} has no "
            "prometheus_url (an operator sets it on the region).",
            detail={"field": "mode", "region": region.code},
        )
