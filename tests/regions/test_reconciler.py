"""The reconciler against real engine processes (the built-in simulator here; real vLLM in test_vllm.py)."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import requests

from core.models import AuditEvent
from regions.engine_keys import engine_api_key
from regions.models import DeploymentEvent, DeploymentTarget
from regions.reconciler import reconcile_region, reconcile_target
from regions.services.deployments import deployment_create, deployment_delete, deployment_scale
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.regions import converge, replica_pids, target_of, tiny_version, until_ready

# The reconciler runs targets on threads with their own database connections: data must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def deployed(world, make_region, tiny_model_dir):
    region = make_region("eu-west-1", "EU")
    version = tiny_version(principal(world.operator), tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    return deployment, region


def test_converges_to_ready_and_serves(deployed):
    deployment, _ = deployed
    target = until_ready(deployment)
    assert target.observed_generation == deployment.generation
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    url = f"{target.endpoints[0]}/v1/chat/completions"
    assert requests.post(url, timeout=5, json=body).status_code == 401  # the engine wants its key
    key = {"Authorization": f"Bearer {engine_api_key(deployment.pk)}"}
    reply = requests.post(url, timeout=5, json=body, headers=key)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    statuses = AuditEvent.objects.filter(action="deployment.status_changed").values_list(
        "after__status", flat=True
    )
    assert list(statuses) == ["ready", "provisioning"] or list(statuses) == ["ready"]


def test_a_no_op_pass_changes_nothing_and_audits_nothing(deployed):
    deployment, region = deployed
    until_ready(deployment)
    pids = replica_pids(region, deployment)
    events, audits = DeploymentEvent.objects.count(), AuditEvent.objects.count()
    converge(deployment, passes=3)
    assert replica_pids(region, deployment) == pids
    assert (DeploymentEvent.objects.count(), AuditEvent.objects.count()) == (events, audits)


def test_scale_pause_and_delete(world, deployed):
    deployment, region = deployed
    until_ready(deployment)
    deployment_scale(actor=principal(world.alice), deployment=deployment, replicas=2)
    target = until_ready(deployment, replicas=2)
    assert len(target.endpoints) == 2 and len(set(replica_pids(region, deployment))) == 2
    deployment_scale(actor=principal(world.alice), deployment=deployment, replicas=0)
    converge(deployment)
    assert target_of(deployment).status == "paused" and replica_pids(region, deployment) == []
    deployment_delete(actor=principal(world.alice), deployment=deployment)
    converge(deployment)
    deployment.refresh_from_db()
    assert deployment.state == "deleted" and target_of(deployment).status == "deleted"


def test_killed_engine_is_detected_healed_and_recorded(deployed):
    deployment, region = deployed
    until_ready(deployment)
    (pid,) = replica_pids(region, deployment)
    os.killpg(pid, signal.SIGKILL)
    wait_for(
        lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    )
    target = until_ready(deployment)
    (new_pid,) = replica_pids(region, deployment)
    assert new_pid != pid and target.status == "ready"
    assert DeploymentEvent.objects.filter(
        deployment=deployment, kind="drift", message__contains="died"
    ).exists()


def test_drift_made_outside_is_corrected_and_audited(deployed):
    deployment, region = deployed
    until_ready(deployment)
    spec_file = Path(region.driver_config["state_dir"]) / f"cp-{deployment.pk}-chat" / "spec.json"
    tampered = json.loads(spec_file.read_text())
    tampered["replicas"] = 3  # someone "scaled" the workload by hand
    spec_file.write_text(json.dumps(tampered))
    until_ready(deployment)
    assert json.loads(spec_file.read_text())["replicas"] == 1
    assert (
        AuditEvent.objects.filter(action="deployment.drift_corrected", message__contains="replicas").count()
        == 1
    )


def test_crashed_reconcile_leaves_nothing_duplicated(deployed):
    deployment, region = deployed
    target = target_of(deployment)
    # A worker claimed the target and died after writing the spec but before starting engines.
    DeploymentTarget.objects.filter(pk=target.pk).update(lease_until="2000-01-01T00:00:00Z")
    folder = Path(region.driver_config["state_dir"]) / f"cp-{deployment.pk}-chat"
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(json.dumps({"hash": "stale", "replicas": 1, "spec": {}}))
    reconcile_region(region.pk)
    until_ready(deployment)
    assert len(replica_pids(region, deployment)) == 1


def test_missing_artifact_fails_permanently_with_the_reason(world, make_region, tiny_model_dir, tmp_path):
    from registry.models import ModelVersion

    make_region("eu-west-1", "EU")
    version = tiny_version(principal(world.operator), tiny_model_dir)
    ModelVersion.objects.filter(pk=version.pk).update(artifact_uri=f"file://{tmp_path}/gone")
    deployment = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    converge(deployment)
    target = target_of(deployment)
    assert target.status == "failed" and "does not exist on this host" in target.last_error


def test_one_regions_failure_does_not_block_another(world, make_region, tiny_model_dir, tmp_path):
    from regions.services.regions import region_create

    make_region("eu-west-1", "EU")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "x",
                "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
                "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
                "users": [{"name": "x", "user": {}}],
            }
        )
    )
    region_create(
        actor=principal(world.operator),
        code="eu-central-1",
        name="Frankfurt",
        provider="aws",
        jurisdiction="EU",
        driver="kubernetes",
        driver_config={"namespace": "llm", "kubeconfig_file": str(kubeconfig), "connect_timeout": 1},
        gpu_pools=[{"gpu_type": "L4", "memory_gib": 24, "gpu_count": 4}],
    )
    version = tiny_version(principal(world.operator), tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    assert deployment.targets.count() == 2
    start = time.monotonic()
    converge(deployment)
    broken = deployment.targets.get(region__code="eu-central-1")
    assert "unreachable" in broken.last_error and broken.attempts == 1 and broken.status == "pending"
    assert broken.next_attempt_at.timestamp() > time.time()  # backed off, not hammering
    eu = deployment.targets.get(region__code="eu-west-1")

    def eu_ready():
        reconcile_region(eu.region_id)
        return DeploymentTarget.objects.filter(pk=eu.pk, status="ready").first()

    assert wait_for(eu_ready, timeout=30).ready_replicas == 1 and time.monotonic() - start < 30
    assert DeploymentTarget.objects.get(pk=broken.pk).attempts == 1  # its backoff was respected meanwhile
    reconcile_target(broken.pk)  # not due yet: the claim succeeds but the error only grows the backoff
    assert DeploymentTarget.objects.get(pk=broken.pk).attempts == 2


def test_following_an_alias_rolls_the_deployment_when_the_alias_moves(world, make_region, tiny_model_dir):
    from tests.support.registry import advance, register

    make_region("eu-west-1", "EU")
    operator = principal(world.operator)
    first = tiny_version(operator, tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice),
        owner=world.tenant_a,
        name="chat",
        model=first.model,
        follow_alias="production",
    )
    until_ready(deployment)
    second = advance(
        register(
            first.model,
            operator,
            "1.1.0",
            artifact_uri=first.artifact_uri,
            served_model_name="tiny",
            parameter_count=3_000_000,
            dtype="float32",
            max_context_length=512,
            engine_args=first.engine_args,
            artifact_manifest=[],
            allowed_jurisdictions=["EU", "US"],
        ),
        operator,
        "production",
    )
    until_ready(deployment)
    deployment.refresh_from_db()
    assert deployment.version_id == second.pk and deployment.generation == 2
    assert DeploymentEvent.objects.filter(
        deployment=deployment, kind="rollout", message__contains="1.1.0"
    ).exists()
    assert AuditEvent.objects.filter(action="deployment.rolled", target_id=str(deployment.pk)).count() == 1


@pytest.mark.slow
def test_a_celery_worker_converges_a_new_deployment_by_itself(
    world, make_region, tiny_model_dir, celery_worker
):
    make_region("eu-west-1", "EU")
    version = tiny_version(principal(world.operator), tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    # Enqueued after commit; the worker reconciles (and keeps doing so while the engine starts).
    from regions.tasks import reconcile_region as task

    def ready():
        target = target_of(deployment)
        if target.status != "ready":
            task.delay(target.region_id)
        return target.status == "ready"

    wait_for(ready, timeout=60, interval=1)
