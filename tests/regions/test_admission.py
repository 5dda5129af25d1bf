"""Admission: residency, the version's jurisdictions, lifecycle, capacity and quota, with reasons."""

import pytest

from core.errors import Conflict
from core.models import AuditEvent
from regions.models import Deployment, DeploymentTarget
from regions.services.deployments import deployment_create
from regions.services.regions import region_set_status
from tests.support.principals import principal
from tests.support.regions import tiny_version


@pytest.fixture
def setup(world, make_region, tiny_model_dir):
    regions = {
        "eu": make_region("eu-west-1", "EU"),
        "ch": make_region("ch-zrh-1", "CH"),
        "us": make_region("us-east-1", "US"),
    }
    version = tiny_version(principal(world.operator), tiny_model_dir)
    return regions, version


def create(world, version, user=None, **kwargs):
    return deployment_create(
        actor=principal(user or world.alice),
        owner=world.tenant_a,
        name="chat",
        model=version.model,
        version="1.0.0",
        **kwargs,
    )


def test_policy_placement_takes_only_compliant_regions(world, setup):
    _, version = setup
    deployment = create(world, version)
    # acme may use EU and CH; the version is allowed in EU and US: only EU qualifies.
    assert [t.region.code for t in deployment.targets.all()] == ["eu-west-1"]
    assert deployment.gpu_type == "L4" and deployment.gpu_count == 1
    assert AuditEvent.objects.filter(action="deployment.created").count() == 1


@pytest.mark.parametrize(
    ("code", "reason"),
    [("us-east-1", "outside acme's residency policy"), ("ch-zrh-1", "may not be served in CH")],
)
def test_explicit_non_compliant_region_is_refused_naming_the_reason(world, setup, code, reason):
    _, version = setup
    with pytest.raises(Conflict, match=reason) as err:
        create(world, version, regions=[code])
    assert err.value.code == "region_not_eligible"
    assert not Deployment.objects.exists() and not DeploymentTarget.objects.exists()


def test_capacity_and_quota(world, setup):
    _, version = setup
    with pytest.raises(Conflict, match="needs 5 L4 GPUs, 4 free"):
        create(world, version, regions=["eu-west-1"], replicas=5)
    world.tenant_a.max_gpus = 2
    world.tenant_a.save()
    with pytest.raises(Conflict, match="quota is 2"):
        create(world, version, replicas=3, user=world.alice)
    create(world, version, replicas=2)
    with pytest.raises(Conflict, match="quota"):
        deployment_create(
            actor=principal(world.alice),
            owner=world.tenant_a,
            name="second",
            model=version.model,
            version="1.0.0",
        )


def test_lifecycle_decides_who_may_deploy(world, make_region, tiny_model_dir):
    make_region("eu-west-1", "EU")
    version = tiny_version(principal(world.operator), tiny_model_dir, status="staged")
    with pytest.raises(Conflict, match="deployable versions are canary, production"):
        create(world, version)
    deployment = create(world, version, user=world.operator)  # operators may deploy staged versions
    assert deployment.version.status == "staged"


def test_draining_region_takes_no_new_placements(world, setup):
    regions, version = setup
    region_set_status(actor=principal(world.operator), region=regions["eu"], status="draining")
    with pytest.raises(Conflict, match="region is draining"):
        create(world, version)


def test_tenant_cannot_deploy_another_tenants_private_model(world, make_region, tiny_model_dir):
    make_region("us-east-1", "US")
    theirs = tiny_version(principal(world.bob), tiny_model_dir, owner=world.tenant_b)
    from core.errors import NotFound

    with pytest.raises(NotFound):
        create(world, theirs)
