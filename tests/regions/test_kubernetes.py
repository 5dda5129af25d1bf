"""The Kubernetes driver: rendered manifests validate against Kubernetes' schemas, and the driver is
exercised end to end over HTTP against a test API server that speaks the real REST protocol."""

from dataclasses import replace

import kubernetes_validate
import pytest
from kubernetes import client

from core.errors import ValidationFailed
from core.models import AuditEvent
from regions.choices import TargetRole
from regions.drivers.base import WorkloadSpec
from regions.drivers.factory import driver_for
from regions.drivers.kubernetes import (
    SPEC_LABEL,
    KubernetesConfig,
    KubernetesDriver,
    render_manifests,
)
from regions.drivers.throttle import at_most_every
from regions.engine_keys import engine_api_key
from regions.models import Deployment, DeploymentTarget
from regions.services.deployments import deployment_create, deployment_delete
from regions.workloads import workload_spec
from tests.support.kube_api import KubeApiServer
from tests.support.principals import principal
from tests.support.regions import converge, kubernetes_region, tiny_version

pytestmark = pytest.mark.django_db(transaction=True)
SPEC = WorkloadSpec(
    name="cp-7-chat",
    labels={"controlplane.io/tenant": "acme", "controlplane.io/deployment": "7"},
    replicas=2,
    served_model_name="llama-3-8b-instruct",
    model_uri="s3://models-eu/llama/1.0.0/",
    runtime_image="vllm/vllm-openai:v0.33.0",
    engine_args={"max_model_len": 8192, "enable_prefix_caching": True, "tensor_parallel_size": 2},
    gpu_type="A100-80GB",
    gpu_count=2,
    node_labels={"nvidia.com/gpu.product": "A100-SXM4-80GB"},
    taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    artifact_bytes=16 * 1024**3,
)
CONFIG = KubernetesConfig(namespace="llm", kubeconfig_file="/dev/null", object_store_secret="models-eu-s3")


@pytest.mark.parametrize("manifest", render_manifests(SPEC, CONFIG), ids=lambda m: m["kind"])
def test_rendered_manifests_validate_against_the_kubernetes_schema(manifest):
    kubernetes_validate.validate(manifest, kubernetes_validate.utils.latest_version(), strict=True)


def test_rendered_deployment_follows_the_reference_deployments():
    deployment, service = render_manifests(SPEC, CONFIG)
    pod = deployment["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    assert engine["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert engine["args"][:4] == [
        "--model",
        "/models/cp-7-chat",
        "--served-model-name",
        "llama-3-8b-instruct",
    ]
    assert "--tensor-parallel-size" in engine["args"] and "--enable-prefix-caching" in engine["args"]
    assert engine["ports"][0]["containerPort"] == 8000
    startup = engine["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # ~10 minutes of weight loading
    assert engine["readinessProbe"]["httpGet"]["path"] == "/health"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["volumes"]
    assert (
        pod["initContainers"][0]["name"] == "fetch-model"
        and "s3://models-eu/llama/1.0.0/" in pod["initContainers"][0]["command"]
    )
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert engine["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "A100-SXM4-80GB"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert deployment["metadata"]["labels"]["controlplane.io/tenant"] == "acme"
    assert service["metadata"]["name"] == "cp-7-chat-engine" != "vllm"


def test_engines_send_their_spans_where_the_region_says_and_a_bad_receiver_is_refused():
    traced = replace(CONFIG, otlp_traces_endpoint="http://otel-collector.observability:4318/v1/traces")
    deployment, _ = render_manifests(SPEC, traced)
    kubernetes_validate.validate(deployment, kubernetes_validate.utils.latest_version(), strict=True)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--otlp-traces-endpoint", "http://otel-collector.observability:4318/v1/traces"]
    untraced = render_manifests(SPEC, CONFIG)[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--otlp-traces-endpoint" not in untraced
    for bad in ("otel:4318", "http://a b", "ftp://x", 5):
        with pytest.raises(ValidationFailed, match="otlp_traces_endpoint"):
            KubernetesConfig.parse({"namespace": "llm", "kubeconfig_file": "/k", "otlp_traces_endpoint": bad})


@pytest.fixture
def server():
    with KubeApiServer() as running:
        yield running


@pytest.fixture
def kube(world, server, tmp_path):
    kubernetes_region(principal(world.operator), server.kubeconfig(), tmp_path)
    return server


@pytest.fixture
def chat(world, kube, tiny_model_dir):
    version = tiny_version(principal(world.operator), tiny_model_dir)
    return deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )


def target(deployment) -> DeploymentTarget:  # type: ignore[no-untyped-def]
    return DeploymentTarget.objects.get(deployment=deployment)


def test_deployment_converges_with_server_side_apply(kube, chat):
    converge(chat)
    name = f"cp-{chat.pk}-chat"
    assert (
        "PATCH",
        f"/apis/apps/v1/namespaces/llm/deployments/{name}?fieldManager=controlplane&force=true",
    ) in (kube.state.requests)
    stored = kube.state.objects[("deployments", "llm", name)]
    assert stored["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert ("services", "llm", f"{name}-engine") in kube.state.objects
    found = target(chat)
    assert found.status == "ready" and found.endpoints == [f"http://{name}-engine.llm.svc.cluster.local:8000"]
    # From the pod's own timestamps: scheduled → fetch-model finished → Ready.
    assert found.cold_starts == [
        {"replica": 0, "weights_seconds": 42.0, "engine_seconds": 70.0, "total_seconds": 112.0}
    ]


def test_engines_leave_the_service_before_they_stop_and_drains_take_one_at_a_time(kube, chat):
    converge(chat)
    name = f"cp-{chat.pk}-chat"
    budget = kube.state.objects[("poddisruptionbudgets", "llm", name)]
    kubernetes_validate.validate(budget, kubernetes_validate.utils.latest_version(), strict=True)
    assert budget["spec"]["maxUnavailable"] == 1
    pods = kube.state.objects[("deployments", "llm", name)]["spec"]["template"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pods["metadata"]["labels"].items()
    engine = pods["spec"]["containers"][0]
    assert engine["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    assert pods["spec"]["terminationGracePeriodSeconds"] > 10


def test_engines_read_their_api_key_from_a_secret_that_is_never_rendered(kube, chat):
    converge(chat)
    name, key = f"cp-{chat.pk}-chat", engine_api_key(chat.pk)
    secret = kube.state.objects[("secrets", "llm", f"{name}-engine-key")]
    assert secret["stringData"] == {"api-key": key}
    pod = kube.state.objects[("deployments", "llm", name)]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    ref = {"secretKeyRef": {"name": f"{name}-engine-key", "key": "api-key"}}
    assert env["VLLM_API_KEY"] == {"name": "VLLM_API_KEY", "valueFrom": ref}
    shown = driver_for(target(chat).region).render(workload_spec(target(chat)))
    assert key not in shown and "secretKeyRef" in shown  # what people see names the Secret, not the key


def test_a_no_op_pass_issues_no_writes(kube, chat):
    converge(chat)
    kube.state.requests.clear()
    converge(chat, passes=3)
    assert kube.state.writes() == [] and kube.state.requests  # it looked, and changed nothing


def test_scaling_outside_is_drift_that_is_corrected_and_audited(kube, chat):
    converge(chat)
    name = f"cp-{chat.pk}-chat"
    api = client.AppsV1Api(client.ApiClient(client_configuration(kube)))
    api.patch_namespaced_deployment_scale(name, "llm", {"spec": {"replicas": 5}})  # like kubectl scale
    assert kube.state.objects[("deployments", "llm", name)]["spec"]["replicas"] == 5
    converge(chat)
    assert kube.state.objects[("deployments", "llm", name)]["spec"]["replicas"] == 1
    assert (
        AuditEvent.objects.filter(action="deployment.drift_corrected", message__contains="to 5").count() == 1
    )


def client_configuration(kube: KubeApiServer) -> client.Configuration:
    configuration = client.Configuration()
    configuration.host = kube.url
    return configuration


@pytest.mark.parametrize(
    ("reason", "status", "permanent"),
    [("ImagePullBackOff", "failed", True), ("Unschedulable", "provisioning", False)],
)
def test_pod_problems_surface_as_deployment_errors(kube, chat, reason, status, permanent):
    kube.state.pod_problems[f"cp-{chat.pk}-chat"] = {"reason": reason, "message": "details from the kubelet"}
    converge(chat)
    found = target(chat)
    assert found.status == status and found.last_error.startswith(reason)


def test_unreachable_cluster_keeps_the_last_known_state_and_backs_off(kube, chat):
    converge(chat)
    kube.state.down = True
    converge(chat)
    found = target(chat)
    assert found.status == "ready" and "unreachable" in found.last_error and found.attempts == 1


def test_delete_removes_the_workload(world, kube, chat):
    converge(chat)
    deployment_delete(actor=principal(world.alice), deployment=chat)
    converge(chat)
    chat.refresh_from_db()
    assert chat.state == "deleted" and not kube.state.objects  # its key's Secret and budget too
    assert sum(1 for method, _ in kube.state.requests if method == "DELETE") == 6  # + Ingress, HTTPRoute


def test_the_model_cache_is_sized_from_the_versions_artifact(world, kube, chat):
    from registry.models import ModelVersion

    ModelVersion.objects.filter(pk=chat.version_id).update(artifact_size_bytes=40 * 1024**3)
    converge(chat)
    stored = kube.state.objects[("deployments", "llm", f"cp-{chat.pk}-chat")]
    volumes = {v["name"]: v for v in stored["spec"]["template"]["spec"]["volumes"]}
    claim = volumes["model-cache"]["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == "53Gi"  # 40 GiB × 1.2 headroom + 5 GiB, rounded up
    small = render_manifests(replace(SPEC, artifact_bytes=1024**3), CONFIG)[0]["spec"]["template"]["spec"][
        "volumes"
    ]
    assert small[1]["ephemeral"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"] == "10Gi"


# Rollout progress: ready replicas (and the endpoint) count only replicas of the spec last applied.


def driver_for_server(server: KubeApiServer) -> KubernetesDriver:
    return KubernetesDriver(CONFIG, api_client=client.ApiClient(client_configuration(server)))


def test_a_spec_change_the_controller_has_not_observed_has_no_ready_replica(server):
    driver = driver_for_server(server)
    driver.apply(SPEC)
    assert driver.observe(SPEC.name).ready_replicas == 2
    server.state.lagging.add(SPEC.name)  # the controller has not yet acted on what comes next
    changed = replace(SPEC, runtime_image="vllm/vllm-openai:v0.34.0")
    driver.apply(changed)
    stored = server.state.objects[("deployments", "llm", SPEC.name)]
    assert stored["metadata"]["generation"] == 2 and stored["status"]["observedGeneration"] == 1
    assert stored["status"]["readyReplicas"] == 2  # the old pods still answer, as the old spec
    observed = driver.observe(SPEC.name)
    assert observed.spec_hash == changed.spec_hash
    assert (observed.ready_replicas, observed.endpoints, observed.cold_starts) == (0, [], [])
    server.state.lagging.clear()
    assert driver.observe(SPEC.name).ready_replicas == 2


def test_a_scale_the_controller_has_not_observed_keeps_the_replicas_that_answer(server):
    driver = driver_for_server(server)
    driver.apply(SPEC)
    server.state.lagging.add(SPEC.name)
    driver.apply(replace(SPEC, replicas=3))  # same template: its pods are of the current spec
    observed = driver.observe(SPEC.name)
    assert (observed.replicas, observed.ready_replicas, len(observed.endpoints)) == (3, 2, 1)


@pytest.mark.parametrize(
    ("status", "ready"),
    [
        ({"replicas": 2, "updatedReplicas": 1, "readyReplicas": 2}, 1),  # one new, one old, both ready
        ({"replicas": 2, "updatedReplicas": 1, "readyReplicas": 1}, 0),  # the ready one may be the old one
        ({"replicas": 2, "updatedReplicas": 0, "readyReplicas": 2}, 0),
        ({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 1}, 1),
        ({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}, 2),  # the rollout is complete
    ],
)
def test_only_updated_replicas_that_are_ready_count(server, status, ready):
    driver = driver_for_server(server)
    driver.apply(SPEC)
    server.state.status_overrides[SPEC.name] = status
    observed = driver.observe(SPEC.name)
    assert observed.ready_replicas == ready and len(observed.endpoints) == (1 if ready else 0)


def test_a_rollout_past_its_progress_deadline_is_a_problem_that_keeps_trying(kube, chat):
    name = f"cp-{chat.pk}-chat"
    timed_out = f'ReplicaSet "{name}-5d4f" has timed out progressing.'
    kube.state.held.add(name)
    kube.state.status_overrides[name] = {
        "conditions": [
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": timed_out,
            }
        ]
    }
    converge(chat)
    found = target(chat)
    assert found.status == "provisioning" and found.ready_replicas == 0 and found.endpoints == []
    assert found.last_error == f"ProgressDeadlineExceeded: {timed_out}"


def service_selector(server: KubeApiServer, workload: str) -> str:
    selector = server.state.objects[("services", "llm", f"{workload}-engine")]["spec"]["selector"]
    return ",".join(f"{key}={value}" for key, value in selector.items())


def test_the_route_never_names_a_spec_whose_pods_are_not_answering(kube, chat):
    converge(chat)
    name = f"cp-{chat.pk}-chat"
    kube.state.lagging.add(name)
    Deployment.objects.filter(pk=chat.pk).update(engine_overrides={"max_num_seqs": 8})
    converge(chat)
    found = target(chat)
    assert found.status == "degraded" and found.ready_replicas == 0 and found.endpoints == []
    # The old ReplicaSet's pods still run, but the Service selects only pods of the new spec.
    assert kube.state.pods("llm", f"app.kubernetes.io/instance={name}")
    assert kube.state.pods("llm", service_selector(kube, name)) == []
    kube.state.lagging.clear()
    converge(chat)
    found = target(chat)
    assert found.status == "ready" and found.endpoints == [f"http://{name}-engine.llm.svc.cluster.local:8000"]
    assert len(kube.state.pods("llm", service_selector(kube, name))) == 1


def test_two_revisions_of_a_deployment_coexist_with_their_own_names_and_selectors(kube, chat):
    converge(chat)
    stable = target(chat)
    DeploymentTarget.objects.create(
        deployment=chat, region=stable.region, role=TargetRole.CANDIDATE, revision=1, version=chat.version
    )
    converge(chat)
    baseline, candidate = f"cp-{chat.pk}-chat", f"cp-{chat.pk}-chat-r1"
    targets = {t.revision: t for t in DeploymentTarget.objects.filter(deployment=chat)}
    assert [t.status for t in targets.values()] == ["ready", "ready"]
    assert targets[0].endpoints == [f"http://{baseline}-engine.llm.svc.cluster.local:8000"]
    assert targets[1].endpoints == [f"http://{candidate}-engine.llm.svc.cluster.local:8000"]
    for workload, revision in ((baseline, "0"), (candidate, "1")):
        stored = kube.state.objects[("deployments", "llm", workload)]
        assert stored["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/instance": workload}
        assert stored["spec"]["template"]["metadata"]["labels"]["controlplane.io/revision"] == revision
        selected = kube.state.pods("llm", service_selector(kube, workload))
        assert [pod["metadata"]["name"] for pod in selected] == [f"{workload}-abc10"]
    assert SPEC_LABEL in kube.state.objects[("services", "llm", f"{candidate}-engine")]["spec"]["selector"]


def test_the_kubeconfig_credentials_are_re_read_at_most_once_a_second():
    """The loader's refresh hook runs before every request; throttled, it still runs on the first request
    and again once a second has passed (an expiring token is renewed minutes early)."""
    now = [100.0]
    calls: list[object] = []
    refresh = at_most_every(1.0, calls.append, clock=lambda: now[0])
    for step in (0.0, 0.4, 0.5, 0.1, 2.0):  # at 100.0, 100.4, 100.9, 101.0, 103.0
        now[0] += step
        refresh("configuration")
    assert len(calls) == 3  # at 100.0, 101.0 and 103.0
