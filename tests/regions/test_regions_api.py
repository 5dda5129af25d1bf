"""Regions and deployments through the API, bad input, and tenant isolation on every endpoint."""

import pytest

from regions.models import Deployment, Region
from tests.support.principals import principal
from tests.support.regions import tiny_version, until_ready

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world_with_regions(world, make_region, tiny_model_dir):
    make_region("eu-west-1", "EU")
    make_region("us-east-1", "US")
    tiny_version(principal(world.operator), tiny_model_dir)
    return world


def new_deployment(owner="acme", **extra):
    return {"owner": owner, "name": "chat", "model": "platform/tiny-llama", "version": "1.0.0", **extra}


def test_tenant_self_service_flow(world_with_regions, api):
    alice = api(world_with_regions.alice)
    placement = alice.get(
        "/api/v1/deployments/placement/?owner=acme&model=platform/tiny-llama&version=1.0.0"
    ).json()
    eligible = {r["code"]: r for r in placement["regions"]}
    assert eligible["eu-west-1"]["eligible"] and not eligible["us-east-1"]["eligible"]
    assert "outside acme's residency policy" in eligible["us-east-1"]["reasons"][0]
    created = alice.post("/api/v1/deployments/", new_deployment(), format="json")
    assert created.status_code == 201, created.content
    assert [t["region"] for t in created.json()["targets"]] == ["eu-west-1"]
    until_ready(Deployment.objects.get(name="chat"))
    detail = alice.get("/api/v1/deployments/acme/chat/").json()
    assert detail["targets"][0]["status"] == "ready" and detail["targets"][0]["endpoints"]
    manifest = alice.get("/api/v1/deployments/acme/chat/manifest/").json()
    assert "--served-model-name tiny" in manifest["eu-west-1"]
    assert (
        alice.post("/api/v1/deployments/acme/chat/scale/", {"replicas": 0}, format="json").json()["replicas"]
        == 0
    )
    events = alice.get("/api/v1/deployments/acme/chat/events/").json()
    assert {e["kind"] for e in events} >= {"created", "status", "scaled"}
    assert alice.delete("/api/v1/deployments/acme/chat/").status_code == 202


@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        (new_deployment(regions=["us-east-1"]), 409, "residency"),
        (new_deployment(regions=["mars-1"]), 409, "No region 'mars-1'"),
        (new_deployment(replicas=9), 409, "GPUs"),
        (new_deployment(version="9.9.9"), 404, "no version"),
        (new_deployment(name="Bad Name"), 400, "name"),
        (new_deployment(engine_overrides={"tensor_paralel_size": 2}), 400, "tensor_paralel_size"),
        (new_deployment(colour="red"), 400, "colour"),
        ({**new_deployment(), "version": "", "follow_alias": ""}, 400, "version to pin or an alias"),
    ],
)
def test_bad_deployments_are_refused_with_the_reason_and_nothing_is_written(
    world_with_regions, api, payload, status, needle
):
    response = api(world_with_regions.alice).post("/api/v1/deployments/", payload, format="json")
    assert response.status_code == status, response.content
    assert needle in response.json()["error"]["message"]
    assert not Deployment.objects.exists()


def test_other_tenants_cannot_see_or_touch_a_deployment(world_with_regions, api):
    api(world_with_regions.alice).post("/api/v1/deployments/", new_deployment(), format="json")
    bob = api(world_with_regions.bob)
    assert bob.get("/api/v1/deployments/").json()["count"] == 0
    for path in ["", "events/", "manifest/"]:
        assert bob.get(f"/api/v1/deployments/acme/chat/{path}").status_code == 404
    assert bob.post("/api/v1/deployments/acme/chat/scale/", {"replicas": 3}, format="json").status_code == 404
    assert bob.delete("/api/v1/deployments/acme/chat/").status_code == 404
    assert (
        bob.post("/api/v1/deployments/", new_deployment(), format="json").status_code == 404
    )  # acme is unknown
    assert (
        bob.get(
            "/api/v1/deployments/placement/?owner=acme&model=platform/tiny-llama&version=1.0.0"
        ).status_code
        == 404
    )
    deployment = Deployment.objects.get()
    assert deployment.state == "active" and deployment.replicas == 1
    viewer = api(world_with_regions.vera)
    assert viewer.get("/api/v1/deployments/acme/chat/").status_code == 200
    assert (
        viewer.post("/api/v1/deployments/acme/chat/scale/", {"replicas": 2}, format="json").status_code == 403
    )


def test_regions_are_visible_to_tenants_without_their_driver_settings(world_with_regions, api):
    listed = api(world_with_regions.alice).get("/api/v1/regions/").json()["results"]
    assert {r["code"] for r in listed} == {"eu-west-1", "us-east-1"}
    assert "driver_config" not in listed[0] and listed[0]["engine"] == "simulator"
    assert "driver_config" in api(world_with_regions.operator).get("/api/v1/regions/eu-west-1/").json()


def test_only_operators_manage_regions(world_with_regions, api):
    alice = api(world_with_regions.alice)
    assert (
        alice.post("/api/v1/regions/eu-west-1/status/", {"status": "disabled"}, format="json").status_code
        == 403
    )
    body = {"code": "ap-1", "name": "AP", "provider": "aws", "jurisdiction": "JP", "driver": "process"}
    assert alice.post("/api/v1/regions/", body, format="json").status_code == 403
    operator = api(world_with_regions.operator)
    drained = operator.post(
        "/api/v1/regions/eu-west-1/status/", {"status": "draining", "reason": "maintenance"}, format="json"
    )
    assert drained.status_code == 200 and Region.objects.get(code="eu-west-1").status == "draining"
    bad = operator.post(
        "/api/v1/regions/",
        {**body, "driver": "kubernetes", "driver_config": {"namespace": "x"}},
        format="json",
    )
    assert bad.status_code == 400 and "kubeconfig" in bad.json()["error"]["message"]
    assert operator.post("/api/v1/regions/", {**body, "jurisdiction": "XX"}, format="json").status_code == 400


def test_deployment_pages_are_scoped(client, world_with_regions, api):
    api(world_with_regions.alice).post("/api/v1/deployments/", new_deployment(), format="json")
    client.force_login(world_with_regions.bob)
    assert "acme/chat" not in client.get("/deployments/").content.decode()
    assert client.get("/deployments/acme/chat/").status_code == 404
    assert client.post("/deployments/acme/chat/scale/", {"replicas": 3}).status_code == 404
    assert client.post("/deployments/acme/chat/delete/").status_code == 404
    assert "acme/chat" not in client.get("/regions/eu-west-1/").content.decode()
    form = client.get("/deployments/new/?owner=acme").content.decode()
    assert 'value="acme"' not in form
    assert client.post("/regions/eu-west-1/status/", {"status": "disabled"}).status_code == 403
    assert Deployment.objects.get().state == "active"
    assert Region.objects.get(code="eu-west-1").status == "active"
    client.force_login(world_with_regions.alice)
    assert client.get("/deployments/acme/chat/").status_code == 200
