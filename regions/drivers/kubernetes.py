"""The Kubernetes driver: renders a vLLM workload the way the best public deployments do and applies it
with server-side apply under one field manager.

One API client per region, built from a kubeconfig held by reference (an environment variable naming a
file, or a file path; never the kubeconfig itself in the database), with explicit timeouts.
"""

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import urllib3
import yaml
from kubernetes import client, config

from core.errors import ValidationFailed
from regions.drivers.base import (
    DriverError,
    ObservedWorkload,
    Survey,
    WorkloadSpec,
    check_model_source,
    check_otlp_traces_endpoint,
    tracing_flags,
)
from regions.drivers.kubernetes_exposure import Exposure, delete_routes, service_name
from regions.drivers.kubernetes_scaling import (
    APPLY,
    SCALER_ANNOTATION,
    SPEC_HASH_ANNOTATION,
    ScalerObjects,
    manifest_kind,
    scaler_manifest,
    scaler_of,
)
from regions.drivers.kubernetes_status import (
    FETCH_CONTAINER,
    SPEC_LABEL,
    annotations,
    cold_starts,
    current_pods,
    dig,
    first_problem,
    ready_replicas,
    settled_replicas,
    stalled,
)
from regions.drivers.throttle import at_most_every
from regions.engine_keys import workload_api_key
from registry.engine_args import render_flags

FIELD_MANAGER = "controlplane"
REFRESH_EVERY = 1.0  # seconds between re-reads of the kubeconfig's credentials
APPLY_OPTIONS: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force": True, "_content_type": APPLY}
MODELS_MOUNT = "/models"
STARTUP_GRACE_SECONDS = 600  # weights of a large model can take ~10 minutes to load


@dataclass(frozen=True)
class KubernetesConfig:
    namespace: str
    kubeconfig_env: str = ""
    kubeconfig_file: str = ""
    context: str = ""
    storage_class: str = ""
    object_store_secret: str = ""
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    otlp_traces_endpoint: str = ""  # where the engines send their spans (vLLM's --otlp-traces-endpoint)
    exposure: Exposure = field(default_factory=Exposure)  # how gateways reach the engines (see the module)

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> "KubernetesConfig":
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ValidationFailed(f"Unknown Kubernetes driver setting(s): {', '.join(sorted(unknown))}.")
        if "namespace" not in raw:
            raise ValidationFailed("The Kubernetes driver needs a namespace.")
        parsed = cls(**{**raw, "exposure": Exposure.parse(raw.get("exposure"))})
        check_otlp_traces_endpoint(parsed.otlp_traces_endpoint)
        if bool(parsed.kubeconfig_env) == bool(parsed.kubeconfig_file):
            raise ValidationFailed(
                "Give exactly one of kubeconfig_env (a variable naming the file) or kubeconfig_file."
            )
        return parsed

    def kubeconfig_path(self) -> str:
        path = os.environ.get(self.kubeconfig_env, "") if self.kubeconfig_env else self.kubeconfig_file
        if not path or not os.path.exists(path):
            raise DriverError(
                f"kubeconfig not found ({self.kubeconfig_env or self.kubeconfig_file})", permanent=True
            )
        return path


def build_api_client(cfg: KubernetesConfig) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(
        config_file=cfg.kubeconfig_path(), context=cfg.context or None, client_configuration=configuration
    )
    configuration.retries = 0  # the reconciler owns retries and backoff
    # The kubeconfig loader's hook, run before every request, re-applies the whole kubeconfig (the host, and
    # with it the proxies read from the environment) so that an expiring token is renewed. It renews
    # minutes before the expiry: once a second is as safe, and a tenth of an apply's CPU cheaper.
    if configuration.refresh_api_key_hook is not None:
        configuration.refresh_api_key_hook = at_most_every(REFRESH_EVERY, configuration.refresh_api_key_hook)
    # One client per region, shared by a reconcile pass's threads: a connection each, kept alive.
    configuration.connection_pool_maxsize = 64  # the most a region's reconcile_concurrency may be
    return client.ApiClient(configuration)


MANAGED = f"app.kubernetes.io/managed-by={FIELD_MANAGER}"  # selects every object the platform applied


def _labels(spec: WorkloadSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": "serving-engine",
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        **spec.labels,
    }


def _probe(period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _engine_container(spec: WorkloadSpec, cfg: KubernetesConfig) -> dict[str, Any]:
    model_dir = f"{MODELS_MOUNT}/{spec.name}"
    return {
        "name": "vllm",
        "image": spec.runtime_image,
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "args": [
            "--model",
            model_dir,
            "--served-model-name",
            spec.served_model_name,
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            *render_flags(spec.engine_args),
            *tracing_flags(cfg.otlp_traces_endpoint),
        ],
        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
        # On a drain or a rollout: out of the Service's endpoints first (the gateways' probes and the
        # kube-proxy see it go), then SIGTERM, so no new request reaches an engine that is stopping.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "10"]}}},
        "env": [
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "HF_HOME", "value": f"{MODELS_MOUNT}/.hf"},
            {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
            *_api_key_env(spec),
        ],
        "resources": {
            "requests": {
                "cpu": str(4 * spec.gpu_count),
                "memory": f"{16 * spec.gpu_count}Gi",
                "nvidia.com/gpu": str(spec.gpu_count),
            },
            "limits": {"memory": f"{32 * spec.gpu_count}Gi", "nvidia.com/gpu": str(spec.gpu_count)},
        },
        "startupProbe": _probe(10, STARTUP_GRACE_SECONDS // 10),
        "readinessProbe": _probe(5, 3),
        "livenessProbe": _probe(10, 3),
        "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "model-cache", "mountPath": MODELS_MOUNT},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
    }


def _fetch_container(spec: WorkloadSpec, cfg: KubernetesConfig) -> dict[str, Any]:
    """Fills the model cache from the region's own object store before the engine starts."""
    target = f"{MODELS_MOUNT}/{spec.name}"
    endpoint = spec.model_store.get("endpoint_url")
    flags = f" --endpoint-url {endpoint}" if endpoint else ""
    if spec.model_files:
        bucket = spec.model_store["bucket"]
        copies = [
            f"aws s3 cp --only-show-errors{flags} s3://{bucket}/blobs/sha256/{sha} {target}/{path}"
            for path, sha in spec.model_files
        ]
        command = ["sh", "-ec", " && ".join(copies)]
    else:
        check_model_source(spec.model_uri)  # no regional copy: the pod reads the version's own URI
        command = ["aws", "s3", "sync", "--only-show-errors", spec.model_uri, target]
    container: dict[str, Any] = {
        "name": FETCH_CONTAINER,
        "image": "amazon/aws-cli:2.17.0",
        "command": command,
        "volumeMounts": [{"name": "model-cache", "mountPath": MODELS_MOUNT}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
    }
    if cfg.object_store_secret:
        container["envFrom"] = [{"secretRef": {"name": cfg.object_store_secret}}]
    return container


def cache_size(artifact_bytes: int) -> str:
    """The model-cache volume: the artifact with 20 % headroom plus 5 GiB, at least 10 GiB."""
    return f"{max(10, math.ceil(artifact_bytes * 1.2 / 1024**3) + 5)}Gi"


def spec_label(spec: WorkloadSpec) -> str:
    # What the engines run, so retuning an in-cluster scaler never rolls the pods; 63 characters at most.
    return spec.template_hash[:16]


def render_manifests(spec: WorkloadSpec, cfg: KubernetesConfig) -> list[dict[str, Any]]:
    labels = _labels(spec)
    pod_labels = {**labels, SPEC_LABEL: spec_label(spec)}
    # The workload name is per revision (cp-<id>-<name>-r<N>), so a candidate's selector never matches the
    # baseline's pods. The Deployment's selector is immutable once created, so it stays the name alone.
    selector = {"app.kubernetes.io/instance": spec.name}
    cache_claim: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": cache_size(spec.artifact_bytes)}},
    }
    if cfg.storage_class:
        cache_claim["storageClassName"] = cfg.storage_class
    pod_spec: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": 60,
        "initContainers": [_fetch_container(spec, cfg)]
        if spec.model_files or spec.model_uri.startswith("s3://")
        else [],
        "containers": [_engine_container(spec, cfg)],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
            {"name": "model-cache", "ephemeral": {"volumeClaimTemplate": {"spec": cache_claim}}},
        ],
    }
    if spec.node_labels:
        pod_spec["nodeSelector"] = spec.node_labels
    if spec.taints:
        pod_spec["tolerations"] = [
            {
                "key": t["key"],
                "operator": "Equal",
                "value": t.get("value", ""),
                "effect": t.get("effect", "NoSchedule"),
            }
            for t in spec.taints
        ]
    annotations = {SPEC_HASH_ANNOTATION: spec.spec_hash}
    if spec.delegated:
        annotations[SCALER_ANNOTATION] = spec.scaler["kind"]
    metadata = {"name": spec.name, "namespace": cfg.namespace, "labels": labels, "annotations": annotations}
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector},
            "progressDeadlineSeconds": 1200,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }
    service_meta: dict[str, Any] = {
        "name": service_name(spec.name),
        "namespace": cfg.namespace,
        "labels": labels,
    }
    if cfg.exposure.service_type == "LoadBalancer" and cfg.exposure.service_annotations:
        service_meta["annotations"] = dict(cfg.exposure.service_annotations)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": service_meta,
        "spec": {
            "type": cfg.exposure.service_type,
            "selector": {**selector, SPEC_LABEL: spec_label(spec)},
            "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    if spec.delegated:
        # Not ours to apply: the in-cluster scaler writes it, and an applied value would fight it.
        del deployment["spec"]["replicas"]
    return [deployment, service]


def external_route(spec: WorkloadSpec, cfg: KubernetesConfig) -> dict[str, Any] | None:
    """The Ingress or HTTPRoute of the region's exposure mode, if it has one."""
    meta = {"name": spec.name, "namespace": cfg.namespace, "labels": _labels(spec)}
    return cfg.exposure.route(spec.name, service_name(spec.name), meta)


def disruption_budget(spec: WorkloadSpec, cfg: KubernetesConfig) -> dict[str, Any]:
    """A node drain takes at most one of the workload's engines at a time (an unhealthy one always)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": spec.name, "namespace": cfg.namespace, "labels": _labels(spec)},
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/instance": spec.name}},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def key_secret_name(workload: str) -> str:
    return f"{workload}-engine-key"


def _api_key_env(spec: WorkloadSpec) -> list[dict[str, Any]]:
    """vLLM reads its API key from VLLM_API_KEY: taken from the workload's Secret, never written here."""
    if not spec.api_key_id:
        return []
    ref = {"name": key_secret_name(spec.name), "key": "api-key"}
    return [{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": ref}}]


def key_secret(spec: WorkloadSpec, cfg: KubernetesConfig, key: str) -> dict[str, Any]:
    """The Secret holding the engines' API key: applied with the workload, never rendered for people."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": key_secret_name(spec.name), "namespace": cfg.namespace, "labels": _labels(spec)},
        "type": "Opaque",
        "stringData": {"api-key": key},
    }


@contextmanager
def _errors(what: str) -> Iterator[None]:
    """Turns client and transport failures into DriverError; 4xx (but 404/409/429) are permanent."""
    try:
        yield
    except client.ApiException as exc:
        permanent = 400 <= (exc.status or 0) < 500 and exc.status not in (404, 409, 429)
        raise DriverError(
            f"Kubernetes {what} failed: {exc.status} {exc.reason}: {(exc.body or '')[:500]}",
            permanent=permanent,
        ) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise DriverError(f"Kubernetes API unreachable during {what}: {exc}") from exc


def _settled(deployments: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """Workload → (spec hash applied, replicas) of the Deployments whose rollout is complete."""
    found = {}
    for deployment in deployments:
        replicas = settled_replicas(deployment)
        if replicas is not None:
            applied = str(annotations(deployment).get(SPEC_HASH_ANNOTATION, ""))
            found[deployment["metadata"]["name"]] = (applied, replicas)
    return found


def _json(reply: Any) -> Any:
    """The body of a reply read without the client's models (``_preload_content=False``)."""
    try:
        return json.loads(reply.read())
    finally:
        reply.release_conn()


class KubernetesDriver:
    def __init__(self, cfg: KubernetesConfig, api_client: client.ApiClient | None = None):
        self.cfg = cfg
        self.api_client = api_client or build_api_client(cfg)
        self.apps = client.AppsV1Api(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.policy = client.PolicyV1Api(self.api_client)
        self.timeout = (cfg.connect_timeout, cfg.read_timeout)
        self.scalers = ScalerObjects(self.api_client, cfg.namespace, APPLY_OPTIONS, self.timeout)

    def render(self, spec: WorkloadSpec) -> str:
        scaler = scaler_manifest(spec, self.cfg.namespace, _labels(spec))
        route = external_route(spec, self.cfg)
        manifests = [*render_manifests(spec, self.cfg), disruption_budget(spec, self.cfg)]
        manifests += [m for m in (route, scaler) if m]
        return yaml.safe_dump_all(manifests, sort_keys=False)

    def apply(self, spec: WorkloadSpec, absent: bool = False) -> None:
        deployment, service = render_manifests(spec, self.cfg)
        scaler = scaler_manifest(spec, self.cfg.namespace, _labels(spec))
        with _errors("apply"):
            current = None if absent else self._read(spec.name)
            self._retire_scaler(current, scaler)
            key = workload_api_key(spec)
            if key:  # before the Deployment: its pods read it as they start
                secret = key_secret(spec, self.cfg, key)
                self._apply(self.core.patch_namespaced_secret, secret)
            self._apply(self.core.patch_namespaced_service, service)
            self._apply(self.policy.patch_namespaced_pod_disruption_budget, disruption_budget(spec, self.cfg))
            route = external_route(spec, self.cfg)
            if route is not None:
                self.cfg.exposure.apply_route(
                    self.api_client, route, {"_request_timeout": self.timeout, **APPLY_OPTIONS}
                )
            if scaler is not None and current is not None and not scaler_of(current):
                self.scalers.hand_over_replicas(current)
            self._apply(self.apps.patch_namespaced_deployment, deployment)
            if scaler is not None:
                self.scalers.apply(scaler)

    def _apply(self, patch: Any, manifest: dict[str, Any]) -> None:
        """Server-side apply of one object. The reply (the whole object) is read but not turned into the
        client's models: nothing uses it, and parsing it was a tenth of a reconcile's CPU."""
        reply = patch(
            manifest["metadata"]["name"],
            self.cfg.namespace,
            manifest,
            _request_timeout=self.timeout,
            _preload_content=False,
            **APPLY_OPTIONS,
        )
        reply.read()  # drained, so the connection is reused
        reply.release_conn()

    def _retire_scaler(self, current: dict[str, Any] | None, scaler: dict[str, Any] | None) -> None:
        """Before the Deployment is applied: a scaler the spec no longer names goes first, so it never
        scales over replicas the control plane takes back, and KEDA's webhook (which refuses a
        ScaledObject for a workload an HPA scales) sees none when the kind changes."""
        if current is None:
            return
        was = scaler_of(current)
        if was and (scaler is None or manifest_kind(scaler) != was):
            self.scalers.delete(was, current["metadata"]["name"])

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            return _json(
                self.apps.read_namespaced_deployment(
                    name, self.cfg.namespace, _request_timeout=self.timeout, _preload_content=False
                )
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _applied_hash(self, found: dict[str, Any]) -> str:
        """The spec last applied. A delegated workload is whole only with its scaler applied for the same
        spec: one deleted outside, or left from an older spec by a crash between the two applies, reads as
        a changed workload, which the reconciler re-applies."""
        applied = str(annotations(found).get(SPEC_HASH_ANNOTATION, ""))
        kind = scaler_of(found)
        if kind and self.scalers.spec_hash(kind, found["metadata"]["name"]) != applied:
            return ""
        return applied

    def observe(self, name: str) -> ObservedWorkload | None:
        with _errors("read"):
            found = self._read(name)
            if found is None:
                return None
            pods = current_pods(found, self._pods(name))
            applied = self._applied_hash(found)
            endpoint = self._endpoint(name) if ready_replicas(found, pods) else ""
        return self._observed(found, pods, applied, endpoint)

    def _observed(
        self, found: dict[str, Any], pods: list[dict[str, Any]], applied: str, endpoint: str
    ) -> ObservedWorkload:
        """What a workload is, from its Deployment, the pods of its current spec and its endpoint."""
        ready = ready_replicas(found, pods)
        endpoint = endpoint if ready else ""
        replicas = dig(found, "spec", "replicas") or 0  # as the cluster has them, whoever sized it
        problem, permanent = ("", False)
        if ready < replicas:
            problem, permanent = first_problem(pods)
        if ready and not endpoint:
            problem = problem or self.cfg.exposure.waiting_for()
        return ObservedWorkload(
            applied,
            replicas,
            ready,
            [endpoint] if endpoint else [],
            False,
            problem or stalled(found),
            permanent,
            cold_starts(pods) if ready else [],
        )

    def survey(self, starting: bool = False) -> Survey:
        """From one LIST of the platform's Deployments (and one of the exposure's objects outside cluster
        mode): the workloads whose rollout is complete by the Deployment's own status (kubernetes_status.
        settled_replicas). ``starting``: one LIST of their pods too, and every workload observed from
        the listings, except those an in-cluster scaler sizes (their scaler is read by ``observe``)."""
        with _errors("list"):
            listed = _json(
                self.apps.list_namespaced_deployment(
                    self.cfg.namespace,
                    label_selector=MANAGED,
                    _request_timeout=self.timeout,
                    _preload_content=False,
                )
            )["items"]
            settled = _settled(listed)
            own = [d for d in listed if not scaler_of(d)] if starting else []
            pods = self._pods_by_workload() if starting else {}
            names = set(settled) | {d["metadata"]["name"] for d in own}
            urls = self.cfg.exposure.endpoints(
                self.api_client, self.cfg.namespace, MANAGED, sorted(names), self.timeout
            )
        observed = {}
        for found in own:
            name = found["metadata"]["name"]
            applied = str(annotations(found).get(SPEC_HASH_ANNOTATION, ""))
            observed[name] = self._observed(
                found, current_pods(found, pods.get(name, [])), applied, urls[name]
            )
        return Survey(
            settled={
                name: ObservedWorkload(applied, replicas, replicas, [urls[name]])
                for name, (applied, replicas) in settled.items()
                if urls.get(name)
            },
            present=frozenset(deployment["metadata"]["name"] for deployment in listed),
            observed=observed,
        )

    def _pods_by_workload(self) -> dict[str, list[dict[str, Any]]]:
        reply = self.core.list_namespaced_pod(
            self.cfg.namespace, label_selector=MANAGED, _request_timeout=self.timeout, _preload_content=False
        )
        found: dict[str, list[dict[str, Any]]] = {}
        for pod in _json(reply)["items"]:
            instance = (dig(pod, "metadata", "labels") or {}).get("app.kubernetes.io/instance", "")
            found.setdefault(instance, []).append(pod)
        return found

    def _endpoint(self, name: str) -> str:
        """Where gateways call the workload: '' until the cluster reports its external address."""
        return self.cfg.exposure.endpoint(
            self.api_client, self.cfg.namespace, name, service_name(name), self.timeout
        )

    def _pods(self, name: str) -> list[dict[str, Any]]:
        reply = self.core.list_namespaced_pod(
            self.cfg.namespace,
            label_selector=f"app.kubernetes.io/instance={name}",
            _request_timeout=self.timeout,
            _preload_content=False,
        )
        return list(_json(reply)["items"])

    def delete(self, name: str) -> None:
        body = client.V1DeleteOptions(propagation_policy="Foreground")
        with _errors("delete"):
            found = self._read(name)
            if found is not None and scaler_of(found):
                self.scalers.delete(scaler_of(found), name)  # first: nothing scales what is going away
            for remove, target in (
                (self.apps.delete_namespaced_deployment, name),
                (self.core.delete_namespaced_service, service_name(name)),
                (self.core.delete_namespaced_secret, key_secret_name(name)),
                (self.policy.delete_namespaced_pod_disruption_budget, name),
            ):
                try:
                    remove(target, self.cfg.namespace, body=body, _request_timeout=self.timeout)
                except client.ApiException as exc:
                    if exc.status != 404:
                        raise
            delete_routes(self.api_client, self.cfg.namespace, name, body, self.timeout)
