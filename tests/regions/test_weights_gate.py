"""Regions ask the artifacts app (through regions.hooks) whether a region's copy of the weights is verified;
without anyone to answer, a region with its own object store starts nothing (fail closed)."""

from pathlib import Path

import pytest

from regions import hooks
from regions.drivers.base import DriverError, WorkloadSpec
from regions.drivers.process import ProcessConfig, ProcessDriver
from regions.models import DeploymentTarget
from regions.reconciler import reconcile_target
from regions.services.deployments import deployment_create
from tests.support.principals import principal
from tests.support.regions import tiny_version


@pytest.fixture
def no_weights_provider(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(hooks, "_WEIGHTS", [])


def test_a_region_with_a_store_and_no_weights_provider_waits_and_starts_nothing(
    world, make_region, tiny_model_dir, tmp_path, no_weights_provider
):
    region = make_region("eu-west-1", "EU")
    region.object_store = {"kind": "local", "root": str(tmp_path / "store")}
    region.save()
    version = tiny_version(principal(world.operator), tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    reconcile_target(deployment.targets.get().pk)
    target = DeploymentTarget.objects.get(deployment=deployment)
    assert target.status == "waiting" and hooks.NO_WEIGHTS_PROVIDER in target.last_error
    assert not list(Path(region.driver_config["state_dir"]).glob("cp-*/replica-*.json"))


def test_a_region_without_a_store_needs_no_weights_provider(
    world, make_region, tiny_model_dir, no_weights_provider
):
    make_region("eu-west-1", "EU")  # serves the file:// artifact directly, as before artifacts existed
    version = tiny_version(principal(world.operator), tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    reconcile_target(deployment.targets.get().pk)
    assert DeploymentTarget.objects.get(deployment=deployment).status == "provisioning"


def test_the_process_driver_reads_no_store_without_a_weights_provider(
    tmp_path, tiny_model_dir, no_weights_provider
):
    driver = ProcessDriver(ProcessConfig(state_dir=str(tmp_path / "state"), engine="simulator"))
    stored = WorkloadSpec(
        name="cp-1-stored",
        labels={},
        replicas=1,
        served_model_name="stored",
        model_uri=f"file://{tiny_model_dir}",
        runtime_image="",
        engine_args={},
        gpu_type="L4",
        gpu_count=1,
        model_store={"kind": "local", "root": str(tmp_path / "store")},
        model_files=[["config.json", "0" * 64]],
    )
    with pytest.raises(DriverError, match="no artifact service"):
        driver.apply(stored)
