"""A region's reconcile pass at fleet size, against a Kubernetes API server speaking the real protocol: a
converged region is surveyed with one listing and left alone (nothing claimed, nothing written, to the
database or the cluster), and whatever is not exactly as recorded is reconciled as before."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from kubernetes import client

from core.models import AuditEvent
from core.services.audit import verify_chain
from regions import hooks
from regions.models import Deployment, DeploymentEvent, DeploymentTarget, GpuPool
from regions.reconciler import Pending, _claim, _save_all, reconcile_region
from regions.services.deployments import deployment_create
from regions.workloads import target_workload
from registry.models import ModelAlias
from tests.support.kube_api import KubeApiServer
from tests.support.principals import principal
from tests.support.regions import converge, kubernetes_region, tiny_version
from tests.support.rollouts import next_version

pytestmark = pytest.mark.django_db(transaction=True)
LIST = "/apis/apps/v1/namespaces/llm/deployments?labelSelector=app.kubernetes.io/managed-by%3Dcontrolplane"
WRITES = ("INSERT", "UPDATE", "DELETE")
DEPLOYMENTS = "/apis/apps/v1/namespaces/llm/deployments"


@pytest.fixture
def fleet(world, tmp_path, tiny_model_dir):
    """Three converged deployments in one Kubernetes region, the third following the production alias."""
    with KubeApiServer() as kube:
        region = kubernetes_region(principal(world.operator), kube.kubeconfig(), tmp_path)
        version = tiny_version(principal(world.operator), tiny_model_dir)
        alice = principal(world.alice)
        deployments = [
            deployment_create(
                actor=alice, owner=world.tenant_a, name=f"chat-{n}", model=version.model, version="1.0.0"
            )
            for n in range(2)
        ]
        deployments.append(
            deployment_create(
                actor=alice,
                owner=world.tenant_a,
                name="follows",
                model=version.model,
                follow_alias="production",
            )
        )
        for deployment in deployments:
            converge(deployment)
        assert set(DeploymentTarget.objects.values_list("status", flat=True)) == {"ready"}
        yield kube, region, deployments


def all_due() -> None:
    DeploymentTarget.objects.update(next_attempt_at=timezone.now() - timedelta(seconds=1))


def test_a_pass_over_a_converged_region_lists_once_and_writes_nothing(fleet):
    kube, region, _ = fleet
    all_due()
    before = list(DeploymentTarget.objects.order_by("pk").values())
    kube.state.requests.clear()
    with CaptureQueriesContext(connection) as queries:
        assert reconcile_region(region.pk) == 0  # nothing needed action
    assert kube.state.requests == [("GET", LIST)]
    assert [q["sql"] for q in queries if q["sql"].lstrip().startswith(WRITES)] == []
    assert len(queries) <= 8  # a handful, whatever the number of targets
    assert list(DeploymentTarget.objects.order_by("pk").values()) == before


def _name(deployment) -> str:  # type: ignore[no-untyped-def]
    return target_workload(DeploymentTarget.objects.get(deployment=deployment))


def _scale_outside(kube, deployment) -> None:  # type: ignore[no-untyped-def]
    configuration = client.Configuration()
    configuration.host = kube.url
    apps = client.AppsV1Api(client.ApiClient(configuration))
    apps.patch_namespaced_deployment_scale(_name(deployment), "llm", {"spec": {"replicas": 3}})


def _delete_outside(kube, deployment) -> None:  # type: ignore[no-untyped-def]
    kube.state.objects.pop(("deployments", "llm", _name(deployment)))


def _replica_dies(kube, deployment) -> None:  # type: ignore[no-untyped-def]
    kube.state.pod_problems[_name(deployment)] = {"reason": "CrashLoopBackOff", "message": "exit 137"}


def _pool_relabelled(kube, deployment) -> None:  # type: ignore[no-untyped-def]
    # The spec changes without the deployment's generation moving: only comparing specs catches it.
    GpuPool.objects.update(node_labels={"nvidia.com/gpu.product": "NVIDIA-L4-24GB"})


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        (_scale_outside, lambda stored, target: stored["spec"]["replicas"] == 1),
        # Re-created: it is starting (its engines are new) until the next pass's survey sees it up.
        (_delete_outside, lambda stored, target: stored is not None and target.status == "provisioning"),
        (_replica_dies, lambda stored, target: target.status == "degraded" and target.ready_replicas == 0),
        (
            _pool_relabelled,
            lambda stored, target: (
                stored["spec"]["template"]["spec"]["nodeSelector"]
                == {"nvidia.com/gpu.product": "NVIDIA-L4-24GB"}
            ),
        ),
    ],
    ids=["scaled outside", "deleted outside", "a replica died", "the GPU pool relabelled"],
)
def test_what_is_not_as_recorded_is_reconciled_and_the_rest_left_alone(fleet, change, expect):
    kube, region, deployments = fleet
    changed, untouched = deployments[0], deployments[1]
    change(kube, changed)
    all_due()
    kube.state.requests.clear()
    acted = reconcile_region(region.pk)
    target = DeploymentTarget.objects.get(deployment=changed)
    assert expect(kube.state.objects.get(("deployments", "llm", _name(changed))), target)
    if change is _pool_relabelled:
        assert acted == 3  # every workload in the pool
    else:
        assert acted == 1
        assert not [path for method, path in kube.state.requests if _name(untouched) in path]


def test_a_moved_alias_is_followed_by_the_pass(fleet, world, tiny_model_dir):
    kube, region, deployments = fleet
    follows = deployments[2]
    newer = next_version(principal(world.operator), follows.version, "1.1.0", status="production")
    ModelAlias.objects.filter(model=follows.model, name="production").update(version=newer)
    all_due()
    assert reconcile_region(region.pk) == 1
    follows.refresh_from_db()
    assert follows.version == newer
    stored = kube.state.objects[("deployments", "llm", _name(follows))]
    assert stored["metadata"]["labels"]["controlplane.io/version"] == "1.1.0"


def test_passes_record_their_batch_together_and_observe_starting_engines_from_listings(
    world, tmp_path, tiny_model_dir
):
    """New targets: no GET for a workload the survey did not list, the starting engines observed from two
    listings, one status event and one audit event per change (the chain intact), and the status
    listeners told once per pass's batch."""

    told: list[list[hooks.StatusChange]] = []
    hooks.STATUS_LISTENERS.append(told.append)
    try:
        with KubeApiServer() as kube:
            region = kubernetes_region(principal(world.operator), kube.kubeconfig(), tmp_path)
            version = tiny_version(principal(world.operator), tiny_model_dir)
            for n in range(3):
                deployment_create(
                    actor=principal(world.alice),
                    owner=world.tenant_a,
                    name=f"new-{n}",
                    model=version.model,
                    version="1.0.0",
                )
            audited = AuditEvent.objects.filter(action="deployment.status_changed").count()
            kube.state.requests.clear()
            assert reconcile_region(region.pk) == 3
            workloads = {_name(d) for d in Deployment.objects.filter(name__startswith="new-")}
            for name in workloads:
                mine = [m for m, path in kube.state.requests if path.startswith(f"{DEPLOYMENTS}/{name}")]
                # The listing said absent: applied without a look (before this change: two GETs first),
                # and not looked at right after (just created, it is starting).
                assert "GET" not in mine, name
            assert set(DeploymentTarget.objects.values_list("status", flat=True)) == {"provisioning"}
            all_due()
            kube.state.requests.clear()
            assert reconcile_region(region.pk) == 3
            # Engines starting: one listing of the Deployments and one of their pods, no look at each.
            assert [m for m, _ in kube.state.requests] == ["GET", "GET"]
    finally:
        hooks.STATUS_LISTENERS.remove(told.append)
    assert set(DeploymentTarget.objects.values_list("status", flat=True)) == {"ready"}
    assert all(t.cold_starts for t in DeploymentTarget.objects.all())  # from the listed pods
    assert DeploymentEvent.objects.filter(kind="status").count() == 6
    assert AuditEvent.objects.filter(action="deployment.status_changed").count() == audited + 6
    assert verify_chain().ok
    assert [{(c.before, c.after) for c in batch} for batch in told] == [
        {("pending", "provisioning")},
        {("provisioning", "ready")},
    ]


def test_a_status_changed_by_another_writer_after_the_claim_stands(fleet):
    """Recording is a compare-and-set on the status the outcome was decided from: a target another writer
    moved meanwhile keeps that writer's status (no event, no audit), while its neighbours in the batch are
    recorded with their own values."""
    _, region, deployments = fleet
    claimed = _claim([t.pk for t in DeploymentTarget.objects.filter(deployment__in=deployments[:2])])
    moved, kept = claimed
    DeploymentTarget.objects.filter(pk=moved.pk).update(status="deleting")  # e.g. a delete meanwhile
    events = DeploymentEvent.objects.count()
    fields = {"last_error": "", "endpoints": ["http://a:8000"], "lease_until": None}
    _save_all(
        [
            Pending(moved, "degraded", {**fields, "ready_replicas": 0}, "engine gone"),
            Pending(kept, "degraded", {**fields, "ready_replicas": 1}, "one replica down"),
        ]
    )
    moved.refresh_from_db()
    kept.refresh_from_db()
    assert (moved.status, moved.lease_until) == ("deleting", moved.lease_until)
    assert moved.lease_until is not None  # nothing of the lost outcome was written
    assert (kept.status, kept.ready_replicas, kept.endpoints, kept.lease_until) == (
        "degraded",
        1,
        ["http://a:8000"],
        None,
    )
    assert list(DeploymentEvent.objects.order_by("pk").values_list("message", flat=True))[events:] == [
        f"{region.code}: ready → degraded (one replica down)"
    ]
    assert verify_chain().ok
