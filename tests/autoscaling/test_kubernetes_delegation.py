"""A deployment whose policy hands scaling to its Kubernetes cluster, reconciled over HTTP against the test
API server: the HPA or ScaledObject follows the policy, the Deployment's replicas are the scaler's (never
applied, never drift), and taking the count back deletes the scaler and applies replicas again."""

from typing import Any

import pytest
from kubernetes import client

from autoscaling.models import AutoscalingPolicy
from autoscaling.policy import parse
from core.models import AuditEvent
from regions.choices import TargetRole
from regions.drivers.kubernetes import SPEC_LABEL
from regions.models import DeploymentEvent, DeploymentTarget, Region
from regions.services.deployments import deployment_create, deployment_delete
from tests.support.kube_api import KubeApiServer
from tests.support.kube_schemas import scaled_object_errors
from tests.support.principals import principal
from tests.support.regions import converge, kubernetes_region, target_of, tiny_version

pytestmark = pytest.mark.django_db(transaction=True)
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
POLICY = {"min_replicas": 1, "max_replicas": 6, "waiting": 5}


@pytest.fixture
def kube(world, tmp_path):
    with KubeApiServer() as server:
        kubernetes_region(principal(world.operator), server.kubeconfig(), tmp_path, prometheus_url=PROMETHEUS)
        yield server


@pytest.fixture
def chat(world, kube, tiny_model_dir):
    version = tiny_version(principal(world.operator), tiny_model_dir)
    return deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )


def delegate(
    deployment, mode: str = "hpa", spec: dict[str, Any] = POLICY, **fields: Any
) -> AutoscalingPolicy:  # type: ignore[no-untyped-def]
    """The policy as the policy service stores it (validated), written directly (no actor needed)."""
    parse(spec)
    policy, _ = AutoscalingPolicy.objects.update_or_create(
        deployment=deployment, defaults={"mode": mode, "spec": spec, "updated_by_name": "alice", **fields}
    )
    return policy


def stored(kube: KubeApiServer, kind: str, name: str) -> dict[str, Any] | None:
    return kube.state.objects.get((kind, "llm", name))


def scale_in_cluster(kube: KubeApiServer, name: str, replicas: int) -> None:
    """What the HPA's controller (or KEDA's) does: an update of the scale subresource."""
    configuration = client.Configuration()
    configuration.host = kube.url
    apps = client.AppsV1Api(client.ApiClient(configuration))
    apps.patch_namespaced_deployment_scale(
        name, "llm", {"spec": {"replicas": replicas}}, field_manager="horizontal-pod-autoscaler"
    )


def test_an_hpa_policy_is_rendered_beside_the_workload_and_sizes_it(kube, chat):
    delegate(chat)
    converge(chat)
    name = f"cp-{chat.pk}-chat"
    hpa = stored(kube, "horizontalpodautoscalers", name)
    assert hpa is not None
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 6)
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    assert "controlplane" not in kube.state.replica_owners[name]  # replicas were never applied
    found = target_of(chat)
    assert (
        found.status == "ready"
        and found.applied_hash == hpa["metadata"]["annotations"]["controlplane.io/spec-hash"]
    )


def test_replicas_the_scaler_chose_are_not_drift(kube, chat):
    delegate(chat)
    converge(chat)
    name = f"cp-{chat.pk}-chat"
    scale_in_cluster(kube, name, 3)
    kube.state.requests.clear()
    converge(chat, passes=2)
    assert kube.state.writes() == []
    assert stored(kube, "deployments", name)["spec"]["replicas"] == 3
    assert not DeploymentEvent.objects.filter(deployment=chat, kind="drift").exists()
    assert not AuditEvent.objects.filter(action="deployment.drift_corrected").exists()
    found = target_of(chat)
    assert (found.status, found.ready_replicas, found.desired_replicas) == ("ready", 3, 1)


def test_changing_the_policy_reapplies_the_scaler_without_restarting_engines(kube, chat):
    policy = delegate(chat)
    converge(chat)
    name = f"cp-{chat.pk}-chat"
    before = stored(kube, "deployments", name)
    generation, label = (
        before["metadata"]["generation"],
        before["spec"]["template"]["metadata"]["labels"][SPEC_LABEL],
    )
    scale_in_cluster(kube, name, 2)
    AutoscalingPolicy.objects.filter(pk=policy.pk).update(spec={**POLICY, "waiting": 2.5, "max_replicas": 8})
    converge(chat)
    hpa = stored(kube, "horizontalpodautoscalers", name)
    assert hpa["spec"]["maxReplicas"] == 8
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "2500m"
    after = stored(kube, "deployments", name)
    assert after["spec"]["template"]["metadata"]["labels"][SPEC_LABEL] == label  # no rolling restart
    assert (
        after["spec"]["replicas"] == 2 and after["metadata"]["generation"] == generation + 1
    )  # the HPA's scale
    assert target_of(chat).applied_hash == hpa["metadata"]["annotations"]["controlplane.io/spec-hash"]


def test_a_regions_override_is_what_that_cluster_runs(kube, chat):
    delegate(chat, overrides={"eu-central-1": {"max_replicas": 3}})
    converge(chat)
    assert stored(kube, "horizontalpodautoscalers", f"cp-{chat.pk}-chat")["spec"]["maxReplicas"] == 3


def test_a_keda_policy_renders_a_scaled_object_kedas_crd_accepts(kube, chat):
    delegate(chat, "keda", {**POLICY, "min_replicas": 1, "ttft_p95_seconds": 2, "idle_seconds": 600})
    converge(chat)
    name = f"cp-{chat.pk}-chat"
    scaled_object = stored(kube, "scaledobjects", name)
    assert scaled_object is not None and scaled_object_errors(scaled_object) == []
    spec = scaled_object["spec"]
    assert (spec["minReplicaCount"], spec["cooldownPeriod"]) == (1, 600)
    assert [t["metricType"] for t in spec["triggers"]] == ["AverageValue", "Value"]
    assert all(t["metadata"]["serverAddress"] == PROMETHEUS for t in spec["triggers"])
    assert f'pod=~"{name}-[a-z0-9]+-[a-z0-9]+"' in spec["triggers"][0]["metadata"]["query"]
    assert stored(kube, "horizontalpodautoscalers", name) is None


def test_a_workload_the_cluster_took_to_zero_is_paused_not_repaired(kube, chat):
    delegate(chat, "keda", {**POLICY, "min_replicas": 1})
    converge(chat)
    scale_in_cluster(kube, f"cp-{chat.pk}-chat", 0)
    kube.state.requests.clear()
    converge(chat)
    assert kube.state.writes() == [] and target_of(chat).status == "paused"


@pytest.mark.parametrize("off", [{"mode": "control_plane"}, {"enabled": False}], ids=["mode", "disabled"])
def test_taking_the_count_back_deletes_the_scaler_and_applies_replicas(kube, chat, off):
    policy = delegate(chat)
    converge(chat)
    name = f"cp-{chat.pk}-chat"
    scale_in_cluster(kube, name, 5)
    DeploymentTarget.objects.filter(deployment=chat).update(desired_replicas=2)
    AutoscalingPolicy.objects.filter(pk=policy.pk).update(**off)
    converge(chat)
    assert stored(kube, "horizontalpodautoscalers", name) is None
    assert stored(kube, "deployments", name)["spec"]["replicas"] == 2
    assert kube.state.replica_owners[name] == {"controlplane"}
    found = target_of(chat)
    assert found.status == "ready" and found.ready_replicas == 2


def test_a_candidate_revision_is_sized_by_its_rollout_not_the_scaler(kube, chat):
    delegate(chat)
    converge(chat)
    stable = target_of(chat)
    DeploymentTarget.objects.create(
        deployment=chat, region=stable.region, role=TargetRole.CANDIDATE, revision=1, version=chat.version
    )
    converge(chat)
    candidate = stored(kube, "deployments", f"cp-{chat.pk}-chat-r1")
    assert (
        candidate["spec"]["replicas"] == 1
        and "controlplane.io/scaler" not in candidate["metadata"]["annotations"]
    )
    assert stored(kube, "horizontalpodautoscalers", f"cp-{chat.pk}-chat-r1") is None
    assert stored(kube, "horizontalpodautoscalers", f"cp-{chat.pk}-chat") is not None


def test_a_disabled_region_goes_to_zero_whatever_the_policy(kube, chat):
    delegate(chat)
    converge(chat)
    Region.objects.filter(code="eu-central-1").update(status="disabled")
    converge(chat)
    name = f"cp-{chat.pk}-chat"
    assert stored(kube, "horizontalpodautoscalers", name) is None
    assert stored(kube, "deployments", name)["spec"]["replicas"] == 0
    assert target_of(chat).status == "paused"


def test_deleting_a_delegated_deployment_deletes_its_scaler(world, kube, chat):
    delegate(chat, "keda")
    converge(chat)
    deployment_delete(actor=principal(world.alice), deployment=chat)
    converge(chat)
    chat.refresh_from_db()
    assert chat.state == "deleted" and kube.state.objects == {}
