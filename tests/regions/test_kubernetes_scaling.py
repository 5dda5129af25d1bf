"""The Kubernetes driver delegating replicas to an in-cluster scaler: the HPA and ScaledObject it renders
validate against Kubernetes' schemas and KEDA's CRD, the Deployment it applies has no ``replicas``, and
over HTTP the count moves between the control plane and the scaler without being reset or fought over."""

from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from regions.drivers.base import DriverError, WorkloadSpec
from regions.drivers.kubernetes import KubernetesConfig, KubernetesDriver, render_manifests, spec_label
from regions.drivers.kubernetes_scaling import HANDOVER_MANAGER, quantity, scaler_manifest
from tests.support.kube_api import KubeApiServer
from tests.support.kube_schemas import scaled_object_errors, validate_kubernetes
from tests.support.regions import L4_SPEC as SPEC

CONFIG = KubernetesConfig(namespace="llm", kubeconfig_file="/dev/null")
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"


def scaler(kind: str, **fields: Any) -> dict[str, Any]:
    """The shape autoscaling.kubernetes.scaler_spec produces (tested there), written out here."""
    described = {
        "kind": kind,
        "min_replicas": 1,
        "max_replicas": 6,
        "metrics": [
            {"name": "vllm:num_requests_waiting", "target": 5.0},
            {"name": "vllm:kv_cache_usage_perc", "target": 0.85},
        ],
        "window_seconds": 60,
        "scale_up": {"stabilization_seconds": 0, "percent": 100, "replicas": 4, "period_seconds": 60},
        "scale_down": {"stabilization_seconds": 300, "replicas": 1, "period_seconds": 60},
        "idle_seconds": 900,
        **fields,
    }
    if kind == "keda":
        described.setdefault("prometheus_url", PROMETHEUS)
    return described


TTFT = {"name": "vllm:time_to_first_token_seconds", "target": 2.0, "quantile": 0.95}
HPA_SPEC = replace(SPEC, scaler=scaler("hpa"))
KEDA_SPEC = replace(SPEC, scaler=scaler("keda", min_replicas=0, metrics=[*scaler("keda")["metrics"], TTFT]))


def manifest(spec: WorkloadSpec) -> dict[str, Any]:
    rendered = scaler_manifest(spec, CONFIG.namespace, {"app.kubernetes.io/instance": spec.name})
    assert rendered is not None
    return rendered


# Rendering


@pytest.mark.parametrize(
    "spec",
    [HPA_SPEC, replace(SPEC, scaler=scaler("hpa", min_replicas=0, metrics=scaler("hpa")["metrics"][:1]))],
    ids=["two-metrics", "one-metric-min-zero"],
)
def test_the_rendered_hpa_validates_against_the_kubernetes_schema(spec):
    validate_kubernetes(manifest(spec))


def test_the_rendered_hpa_asks_the_adapter_for_each_signal_per_pod():
    hpa = manifest(HPA_SPEC)["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "cp-7-chat"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 6)
    assert hpa["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "vllm_num_requests_waiting"},
                "target": {"type": "AverageValue", "averageValue": "5"},
            },
        },
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "vllm_kv_cache_usage_perc"},
                "target": {"type": "AverageValue", "averageValue": "850m"},
            },
        },
    ]
    assert hpa["behavior"] == {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": 60},
                {"type": "Pods", "value": 4, "periodSeconds": 60},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": 300,
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
        },
    }


def test_an_hpa_keeps_one_replica_where_the_policy_allows_zero():
    assert manifest(replace(SPEC, scaler=scaler("hpa", min_replicas=0)))["spec"]["minReplicas"] == 1


@pytest.mark.parametrize(("value", "expected"), [(5.0, "5"), (0.85, "850m"), (2.5, "2500m"), (0.0001, "1m")])
def test_targets_are_kubernetes_quantities(value, expected):
    assert quantity(value) == expected


def test_the_rendered_scaled_object_validates_against_kedas_crd():
    assert scaled_object_errors(manifest(KEDA_SPEC)) == []


def test_the_crd_check_refuses_what_the_api_server_would():
    wrong = manifest(KEDA_SPEC)
    wrong["spec"]["minReplicas"] = 1  # the HPA's name for it, not KEDA's
    wrong["spec"]["triggers"][0]["metadata"]["threshold"] = 5  # trigger metadata is a map of strings
    del wrong["spec"]["scaleTargetRef"]
    errors = scaled_object_errors(wrong)
    assert len(errors) == 3
    assert any("minReplicas" in e for e in errors) and any("scaleTargetRef" in e for e in errors)
    assert any(e.startswith("spec.triggers.0.metadata.threshold") for e in errors)


def test_the_scaled_object_queries_the_workloads_pods_in_prometheus():
    spec = manifest(KEDA_SPEC)["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (0, 6, 900)
    assert (
        spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        == manifest(HPA_SPEC)["spec"]["behavior"]
    )
    waiting, kv_cache, ttft = spec["triggers"]
    pods = 'namespace="llm",pod=~"cp-7-chat-[a-z0-9]+-[a-z0-9]+"'
    assert waiting == {
        "type": "prometheus",
        "name": "num-requests-waiting",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": PROMETHEUS,
            "query": f"sum(avg_over_time(vllm:num_requests_waiting{{{pods}}}[60s]))",
            "threshold": "5",
            "ignoreNullValues": "true",
        },
    }
    assert kv_cache["metadata"]["threshold"] == "0.85"
    # A latency target scales the replicas by value / threshold (Value), over all the pods' requests.
    assert ttft["metricType"] == "Value" and ttft["metadata"]["threshold"] == "2"
    assert ttft["metadata"]["query"] == (
        "histogram_quantile(0.95, sum by (le) "
        f"(rate(vllm:time_to_first_token_seconds_bucket{{{pods}}}[60s])))"
    )


@pytest.mark.parametrize(
    ("described", "message"),
    [
        (scaler("hpa", metrics=[TTFT]), "an HPA cannot target vllm:time_to_first_token_seconds"),
        (scaler("keda", prometheus_url=""), "needs the region's prometheus_url"),
        (scaler("knative"), "unknown in-cluster scaler 'knative'"),
    ],
)
def test_a_scaler_that_cannot_be_rendered_is_a_permanent_error(described, message):
    with pytest.raises(DriverError, match=message) as raised:
        manifest(replace(SPEC, scaler=described))
    assert raised.value.permanent


def test_a_delegated_deployment_leaves_replicas_to_the_scaler():
    deployment, _ = render_manifests(HPA_SPEC, CONFIG)
    assert "replicas" not in deployment["spec"]
    assert deployment["metadata"]["annotations"]["controlplane.io/scaler"] == "hpa"
    validate_kubernetes(deployment)
    assert render_manifests(SPEC, CONFIG)[0]["spec"]["replicas"] == 2


def test_retuning_the_scaler_reapplies_without_rolling_the_engines():
    retuned = replace(HPA_SPEC, scaler=scaler("hpa", max_replicas=8))
    assert len({SPEC.spec_hash, HPA_SPEC.spec_hash, retuned.spec_hash}) == 3
    assert spec_label(SPEC) == spec_label(HPA_SPEC) == spec_label(retuned)  # the pods' template label
    assert replace(SPEC, replicas=5).spec_hash == SPEC.spec_hash


def test_the_driver_renders_the_scaler_beside_the_workload():
    documents = KubernetesDriver(CONFIG, api_client=client.ApiClient()).render(KEDA_SPEC)
    assert [line for line in documents.splitlines() if line.startswith("kind:")] == [
        "kind: Deployment",
        "kind: Service",
        "kind: PodDisruptionBudget",
        "kind: ScaledObject",
    ]


# Over HTTP


@pytest.fixture
def server():
    with KubeApiServer() as running:
        yield running


def driver_for_server(server: KubeApiServer) -> KubernetesDriver:
    configuration = client.Configuration()
    configuration.host = server.url
    return KubernetesDriver(CONFIG, api_client=client.ApiClient(configuration))


def stored(server: KubeApiServer, kind: str, name: str = "cp-7-chat") -> dict[str, Any] | None:
    return server.state.objects.get((kind, "llm", name))


def scale_in_cluster(server: KubeApiServer, replicas: int) -> None:
    """What an HPA's controller does: an update of the scale subresource, under its own field manager."""
    configuration = client.Configuration()
    configuration.host = server.url
    apps = client.AppsV1Api(client.ApiClient(configuration))
    apps.patch_namespaced_deployment_scale(
        "cp-7-chat", "llm", {"spec": {"replicas": replicas}}, field_manager="horizontal-pod-autoscaler"
    )


def test_the_hpa_is_applied_server_side_with_strict_field_validation(server):
    driver = driver_for_server(server)
    driver.apply(HPA_SPEC)
    path = "/apis/autoscaling/v2/namespaces/llm/horizontalpodautoscalers/cp-7-chat"
    assert (
        "PATCH",
        f"{path}?fieldManager=controlplane&fieldValidation=Strict&force=true",
    ) in server.state.requests
    hpa = stored(server, "horizontalpodautoscalers")
    assert hpa is not None and hpa["spec"] == manifest(HPA_SPEC)["spec"]
    # Created without replicas, the Deployment starts at the API server's default and the HPA sizes it.
    assert stored(server, "deployments")["spec"]["replicas"] == 1
    assert server.state.replica_owners["cp-7-chat"] == set()
    assert driver.observe("cp-7-chat").spec_hash == HPA_SPEC.spec_hash


def test_the_count_is_handed_over_to_the_scaler_not_reset(server):
    driver = driver_for_server(server)
    driver.apply(replace(SPEC, replicas=3))
    assert server.state.replica_owners["cp-7-chat"] == {"controlplane"}
    driver.apply(HPA_SPEC)
    # The control plane let go of replicas; the hand-over manager holds the 3 until the HPA writes them.
    assert stored(server, "deployments")["spec"]["replicas"] == 3
    assert server.state.replica_owners["cp-7-chat"] == {HANDOVER_MANAGER}
    scale_in_cluster(server, 5)
    driver.apply(replace(HPA_SPEC, runtime_image="vllm/vllm-openai:v0.34.0"))  # a new spec, applied again
    assert stored(server, "deployments")["spec"]["replicas"] == 5  # what the HPA chose, not fought over
    assert driver.observe("cp-7-chat").replicas == 5


def test_a_hand_over_after_the_scaler_wrote_the_count_does_nothing(server):
    driver = driver_for_server(server)
    driver.apply(SPEC)
    scale_in_cluster(server, 4)  # say an HPA left from an earlier delegation wrote it meanwhile
    driver.apply(HPA_SPEC)
    assert stored(server, "deployments")["spec"]["replicas"] == 4


def test_taking_the_count_back_deletes_the_scaler_first_and_applies_replicas(server):
    driver = driver_for_server(server)
    driver.apply(HPA_SPEC)
    scale_in_cluster(server, 5)
    server.state.requests.clear()
    driver.apply(SPEC)
    writes = [(method, path.split("?")[0].rsplit("/", 2)[-2]) for method, path in server.state.writes()]
    assert writes[0] == ("DELETE", "horizontalpodautoscalers")
    assert stored(server, "horizontalpodautoscalers") is None
    deployment = stored(server, "deployments")
    assert (
        deployment["spec"]["replicas"] == 2
        and "controlplane.io/scaler" not in deployment["metadata"]["annotations"]
    )


def test_switching_from_an_hpa_to_keda_passes_kedas_webhook(server):
    driver = driver_for_server(server)
    driver.apply(HPA_SPEC)
    driver.apply(KEDA_SPEC)  # KEDA refuses a ScaledObject for a workload an HPA scales: it went first
    assert stored(server, "horizontalpodautoscalers") is None
    scaled_object = stored(server, "scaledobjects")
    assert scaled_object is not None and scaled_object["spec"]["minReplicaCount"] == 0
    assert stored(server, "deployments")["metadata"]["annotations"]["controlplane.io/scaler"] == "keda"


def test_a_scaler_deleted_outside_reads_as_a_changed_workload(server):
    driver = driver_for_server(server)
    driver.apply(KEDA_SPEC)
    assert driver.observe("cp-7-chat").spec_hash == KEDA_SPEC.spec_hash
    server.state.objects.pop(("scaledobjects", "llm", "cp-7-chat"))
    assert driver.observe("cp-7-chat").spec_hash == ""
    driver.apply(KEDA_SPEC)
    assert driver.observe("cp-7-chat").spec_hash == KEDA_SPEC.spec_hash


def test_deleting_a_delegated_workload_deletes_its_scaler(server):
    driver = driver_for_server(server)
    driver.apply(HPA_SPEC)
    driver.delete("cp-7-chat")
    assert server.state.objects == {}
