"""The in-cluster autoscaler beside a Kubernetes workload: an ``autoscaling/v2`` HorizontalPodAutoscaler or
a KEDA ``ScaledObject`` rendered from ``WorkloadSpec.scaler``, and the API calls that apply, read and
delete it.

``WorkloadSpec.scaler`` (filled by the autoscaling app through ``regions.hooks``) is driver-neutral:

- ``kind``: ``hpa`` or ``keda``; ``min_replicas``, ``max_replicas``;
- ``metrics``: ``[{"name": vLLM metric, "target": per replica, "quantile": q}]``; ``quantile`` only on a
  histogram (TTFT p95: 0.95), whose target is the quantile itself rather than a per-replica share;
- ``window_seconds``: what a KEDA query averages over (an HPA reads what the Prometheus adapter serves);
- ``scale_up``: ``stabilization_seconds``, ``percent``, ``replicas``, ``period_seconds`` (the larger of the
  two limits applies, as HPA's ``selectPolicy: Max``); ``scale_down``: ``stabilization_seconds``,
  ``replicas``, ``period_seconds``;
- ``idle_seconds``: KEDA's ``cooldownPeriod``, the quiet time before the last replica goes (min 0);
- ``prometheus_url``: the region's Prometheus, which KEDA queries from inside the cluster.

Metric names. An HPA reads per-pod metrics from the custom metrics API, served by a Prometheus adapter;
vLLM's names contain ':' (``vllm:num_requests_waiting``), which the adapter's rules conventionally rename,
so the HPA asks for the name with ':' replaced by '_' (``vllm_num_requests_waiting``) and the adapter rule
in docs/autoscaling.md exposes exactly those. KEDA queries Prometheus itself with PromQL over the
workload's pods (the ``namespace`` and ``pod`` labels that Kubernetes service discovery attaches), so it
uses vLLM's names unchanged.
"""

from typing import Any

from kubernetes import client

from regions.drivers.base import DriverError, WorkloadSpec

APPLY = "application/apply-patch+yaml"  # server-side apply
# Holds a Deployment's replicas for the moment the control plane lets go of them and an in-cluster scaler
# has not written them yet (server-side apply's documented hand-over), so they are not reset to 1.
HANDOVER_MANAGER = "controlplane-handover"
SCALER_ANNOTATION = "controlplane.io/scaler"  # on the Deployment: which scaler sizes it (absent: we do)
SPEC_HASH_ANNOTATION = "controlplane.io/spec-hash"
HPA = "hpa"
KEDA = "keda"
KEDA_GROUP, KEDA_VERSION, KEDA_PLURAL = "keda.sh", "v1alpha1", "scaledobjects"
# A Deployment's pods are named <deployment>-<replicaset hash>-<suffix>: exactly two segments after the
# name, so the baseline's pattern never matches a candidate's pods (<name>-r1-<hash>-<suffix>).
POD_PATTERN = "{name}-[a-z0-9]+-[a-z0-9]+"


def adapter_metric_name(metric: str) -> str:
    """The name a Prometheus adapter serves a vLLM gauge under (``vllm:x`` → ``vllm_x``)."""
    return metric.replace(":", "_")


def quantity(value: float) -> str:
    """A Kubernetes quantity in thousandths (0.85 → "850m", 5 → "5"), never rounded down to zero."""
    milli = max(1, round(value * 1000))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def threshold(value: float) -> str:
    return format(value, "g")  # KEDA's trigger metadata is a map of strings; it parses a float


def behavior(scaler: dict[str, Any]) -> dict[str, Any]:
    """HPA v2 ``behavior``: the policy's stabilization windows and rate limits, both directions."""
    up, down = scaler["scale_up"], scaler["scale_down"]
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": up["stabilization_seconds"],
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": up["percent"], "periodSeconds": up["period_seconds"]},
                {"type": "Pods", "value": up["replicas"], "periodSeconds": up["period_seconds"]},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": down["stabilization_seconds"],
            "selectPolicy": "Max",
            "policies": [
                {"type": "Pods", "value": down["replicas"], "periodSeconds": down["period_seconds"]}
            ],
        },
    }


def _metadata(spec: WorkloadSpec, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": spec.name,
        "namespace": namespace,
        "labels": labels,
        "annotations": {SPEC_HASH_ANNOTATION: spec.spec_hash},
    }


def _target_ref(spec: WorkloadSpec) -> dict[str, str]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": spec.name}


def _pods_metric(metric: dict[str, Any]) -> dict[str, Any]:
    if "quantile" in metric:
        # A latency quantile is not a per-pod quantity the HPA can average; the autoscaling app refuses
        # such a policy when it is saved, so this is a stored spec that predates that check.
        raise DriverError(
            f"an HPA cannot target {metric['name']} (a quantile); use KEDA or the control plane",
            permanent=True,
        )
    name = adapter_metric_name(metric["name"])
    target = {"type": "AverageValue", "averageValue": quantity(metric["target"])}
    return {"type": "Pods", "pods": {"metric": {"name": name}, "target": target}}


def hpa_manifest(spec: WorkloadSpec, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    scaler = spec.scaler
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(spec, namespace, labels),
        "spec": {
            "scaleTargetRef": _target_ref(spec),
            "minReplicas": max(1, scaler["min_replicas"]),  # without the alpha HPAScaleToZero gate
            "maxReplicas": scaler["max_replicas"],
            "metrics": [_pods_metric(metric) for metric in scaler["metrics"]],
            "behavior": behavior(scaler),
        },
    }


def pod_matchers(name: str, namespace: str) -> str:
    return f'namespace="{namespace}",pod=~"{POD_PATTERN.format(name=name)}"'


def promql(metric: dict[str, Any], matchers: str, window_seconds: int) -> str:
    """One number for the whole workload. A gauge is summed over its pods (KEDA's AverageValue divides
    by the replica count, so the target stays per replica); a quantile is of all the pods' requests."""
    window = f"[{window_seconds}s]"
    if "quantile" in metric:
        buckets = f"rate({metric['name']}_bucket{{{matchers}}}{window})"
        return f"histogram_quantile({metric['quantile']}, sum by (le) ({buckets}))"
    return f"sum(avg_over_time({metric['name']}{{{matchers}}}{window}))"


def _trigger(metric: dict[str, Any], spec: WorkloadSpec, namespace: str) -> dict[str, Any]:
    scaler = spec.scaler
    query = promql(metric, pod_matchers(spec.name, namespace), scaler["window_seconds"])
    return {
        "type": "prometheus",
        "name": metric["name"].removeprefix("vllm:").replace("_", "-"),
        # Value: the HPA scales the replicas by value / threshold, what a latency target means.
        "metricType": "Value" if "quantile" in metric else "AverageValue",
        "metadata": {
            "serverAddress": scaler["prometheus_url"],
            "query": query,
            "threshold": threshold(metric["target"]),
            "ignoreNullValues": "true",  # no requests yet: no series, or NaN from a quantile of nothing
        },
    }


def scaled_object_manifest(spec: WorkloadSpec, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    scaler = spec.scaler
    if not scaler.get("prometheus_url"):
        raise DriverError("a KEDA ScaledObject needs the region's prometheus_url", permanent=True)
    return {
        "apiVersion": f"{KEDA_GROUP}/{KEDA_VERSION}",
        "kind": "ScaledObject",
        "metadata": _metadata(spec, namespace, labels),
        "spec": {
            "scaleTargetRef": _target_ref(spec),
            "minReplicaCount": scaler["min_replicas"],  # KEDA itself scales to and from zero
            "maxReplicaCount": scaler["max_replicas"],
            "cooldownPeriod": scaler["idle_seconds"],
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior(scaler)}},
            "triggers": [_trigger(metric, spec, namespace) for metric in scaler["metrics"]],
        },
    }


def scaler_manifest(spec: WorkloadSpec, namespace: str, labels: dict[str, str]) -> dict[str, Any] | None:
    """The HPA or ScaledObject for a delegated workload, None when the control plane sizes it."""
    if not spec.scaler:
        return None
    kind = spec.scaler.get("kind")
    if kind == HPA:
        return hpa_manifest(spec, namespace, labels)
    if kind == KEDA:
        return scaled_object_manifest(spec, namespace, labels)
    raise DriverError(f"unknown in-cluster scaler {kind!r} (hpa or keda)", permanent=True)


def scaler_of(deployment: dict[str, Any]) -> str:
    """Which in-cluster scaler a Deployment (as the API server's JSON) was last applied with ('' when the
    control plane sizes it)."""
    annotations = (deployment.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(SCALER_ANNOTATION, ""))


def manifest_kind(manifest: dict[str, Any]) -> str:
    return HPA if manifest["kind"] == "HorizontalPodAutoscaler" else KEDA


class ScalerObjects:
    """The HPA or ScaledObject of a workload in one namespace: server-side applied with the workload's own
    options (field manager, force), with strict field validation so the API server refuses what its
    schema (the CRD's, for KEDA) does not know instead of silently dropping it."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        apply: dict[str, Any],
        timeout: tuple[float, float],
    ):
        self.apps = client.AppsV1Api(api_client)
        self.hpas = client.AutoscalingV2Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.options = {**apply, "field_validation": "Strict", "_request_timeout": timeout}
        self.timeout = timeout

    def apply(self, manifest: dict[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        if manifest_kind(manifest) == HPA:
            self.hpas.patch_namespaced_horizontal_pod_autoscaler(
                name, self.namespace, manifest, **self.options
            )
        else:
            self.custom.patch_namespaced_custom_object(
                KEDA_GROUP, KEDA_VERSION, self.namespace, KEDA_PLURAL, name, manifest, **self.options
            )

    def hand_over_replicas(self, deployment: dict[str, Any]) -> None:
        """The first delegated apply drops ``replicas`` from the control plane's fields; left unowned, the
        API server would reset them to 1. A second field manager first applies the current count alone,
        as the server-side apply docs hand a field to an HPA ("Transferring ownership"), without force: a
        conflict means the scaler has written its own count already, and there is nothing to hold."""
        name = deployment["metadata"]["name"]
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"replicas": (deployment.get("spec") or {}).get("replicas")},
        }
        try:
            self.apps.patch_namespaced_deployment(
                name,
                self.namespace,
                body,
                field_manager=HANDOVER_MANAGER,
                _content_type=APPLY,
                _request_timeout=self.timeout,
            )
        except client.ApiException as exc:
            if exc.status != 409:
                raise

    def spec_hash(self, kind: str, name: str) -> str:
        """The spec hash the scaler was applied for; '' when it is missing."""
        try:
            annotations = (
                self._hpa_annotations(name) if kind == HPA else self._scaled_object_annotations(name)
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return ""
            raise
        return str(annotations.get(SPEC_HASH_ANNOTATION, ""))

    def _hpa_annotations(self, name: str) -> dict[str, str]:
        found = self.hpas.read_namespaced_horizontal_pod_autoscaler(
            name, self.namespace, _request_timeout=self.timeout
        )
        return (found.metadata.annotations if found.metadata else None) or {}

    def _scaled_object_annotations(self, name: str) -> dict[str, str]:
        found = self.custom.get_namespaced_custom_object(
            KEDA_GROUP, KEDA_VERSION, self.namespace, KEDA_PLURAL, name, _request_timeout=self.timeout
        )
        metadata = found.get("metadata") if isinstance(found, dict) else None
        return (metadata or {}).get("annotations") or {}

    def delete(self, kind: str, name: str) -> None:
        try:
            if kind == HPA:
                self.hpas.delete_namespaced_horizontal_pod_autoscaler(
                    name, self.namespace, _request_timeout=self.timeout
                )
            else:
                self.custom.delete_namespaced_custom_object(
                    KEDA_GROUP, KEDA_VERSION, self.namespace, KEDA_PLURAL, name, _request_timeout=self.timeout
                )
        except client.ApiException as exc:
            if exc.status != 404:
                raise
