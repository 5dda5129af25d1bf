"""Tenant A's private models are invisible to tenant B everywhere; catalog models are read-only to tenants."""

import pytest

from registry.models import ModelVersion, RegisteredModel
from registry.services.models import model_register
from tests.support.principals import principal
from tests.support.registry import advance, register, version_payload

A = "/api/v1/models/acme/llama-3-8b"


@pytest.fixture
def a_version(world, chat_model):
    return advance(register(chat_model, principal(world.alice), "1.0.0"), principal(world.alice), "validated")


@pytest.fixture
def catalog_model(world):
    model = model_register(actor=principal(world.operator), owner=None, name="qwen3-8b", visibility="catalog")
    register(model, principal(world.operator), "1.0.0")
    return model


def test_private_model_is_invisible_to_another_tenant_through_every_read(world, api, a_version):
    bob = api(world.bob)
    assert "acme/llama-3-8b" not in str(bob.get("/api/v1/models/").json())
    for path in [
        "/",
        "/versions/",
        "/versions/1.0.0/",
        "/versions/1.0.0/transitions/",
        "/versions/1.0.0/reports/",
        "/versions/1.0.0/lineage/",
        "/aliases/",
        "/aliases/staging/",
        "/aliases/staging/history/",
        "/diff/?from=1.0.0&to=1.0.0",
    ]:
        assert bob.get(A + path).status_code == 404, path
    assert api(world.alice).get(A + "/versions/1.0.0/").status_code == 200
    assert api(world.auditor).get(A + "/versions/1.0.0/").status_code == 200


def test_another_tenant_cannot_write_to_a_private_model(world, api, a_version):
    bob = api(world.bob)
    assert bob.post(A + "/versions/", version_payload("2.0.0"), format="json").status_code == 404
    assert bob.post(A + "/versions/1.0.0/transitions/", {"to": "staged"}, format="json").status_code == 404
    assert (
        bob.post(A + "/versions/1.0.0/reports/", {"metrics": {"mmlu": 1}}, format="json").status_code == 404
    )
    assert (
        bob.patch(A + "/versions/1.0.0/", {"allowed_jurisdictions": ["US"]}, format="json").status_code == 404
    )
    assert bob.put(A + "/aliases/stable/", {"version": "1.0.0"}, format="json").status_code == 404
    assert bob.patch(A + "/", {"description": "pwned"}, format="json").status_code == 404
    assert bob.post(A + "/rollback/", {"reason": "x"}, format="json").status_code == 404
    created = bob.post("/api/v1/models/", {"owner": "acme", "name": "intruder"}, format="json")
    assert created.status_code == 404
    a_version.refresh_from_db()
    assert a_version.status == "validated" and ModelVersion.objects.count() == 1
    assert not RegisteredModel.objects.filter(name="intruder").exists()


def test_roles_inside_the_owner_tenant(world, api, a_version):
    assert api(world.vera).get(A + "/").status_code == 200  # viewers read
    assert api(world.vera).post(A + "/versions/", version_payload("2.0.0"), format="json").status_code == 403
    assert (
        api(world.vera).post(A + "/versions/1.0.0/transitions/", {"to": "staged"}, format="json").status_code
        == 403
    )
    assert (
        api(world.dave).post(A + "/versions/1.0.0/transitions/", {"to": "staged"}, format="json").status_code
        == 200
    )


def test_catalog_models_are_visible_to_all_tenants_but_only_the_platform_changes_them(
    world, api, catalog_model
):
    for user in (world.alice, world.bob):
        client = api(user)
        assert "platform/qwen3-8b" in str(client.get("/api/v1/models/").json())
        assert client.get("/api/v1/models/platform/qwen3-8b/versions/1.0.0/").status_code == 200
        transition = client.post(
            "/api/v1/models/platform/qwen3-8b/versions/1.0.0/transitions/",
            {"to": "validating"},
            format="json",
        )
        assert transition.status_code == 403
    ok = api(world.operator).post(
        "/api/v1/models/platform/qwen3-8b/versions/1.0.0/transitions/", {"to": "validating"}, format="json"
    )
    assert ok.status_code == 200


def test_registry_pages_are_scoped(client, world, a_version, catalog_model):
    client.force_login(world.bob)
    catalog = client.get("/registry/").content.decode()
    assert "platform/qwen3-8b" in catalog and "acme/llama-3-8b" not in catalog
    for path in [
        "/registry/acme/llama-3-8b/",
        "/registry/acme/llama-3-8b/1.0.0/",
        "/registry/acme/llama-3-8b/compare/?from=1.0.0&to=1.0.0",
    ]:
        assert client.get(path).status_code == 404, path
    posted = client.post("/registry/acme/llama-3-8b/1.0.0/transition/", {"to": "staged"})
    assert posted.status_code == 404
    assert client.post("/registry/acme/llama-3-8b/rollback/", {"reason": "x"}).status_code == 404
    assert (
        client.post(
            "/registry/", {"owner": "acme", "name": "intruder", "task": "chat", "visibility": "private"}
        ).status_code
        == 400
    )
    a_version.refresh_from_db()
    assert a_version.status == "validated" and not RegisteredModel.objects.filter(name="intruder").exists()
    client.force_login(world.alice)
    assert client.get("/registry/acme/llama-3-8b/1.0.0/").status_code == 200
