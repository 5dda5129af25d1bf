"""A deployment's fallbacks through the API: set in order, shown on the deployment, published in the route
table for that tenant only; another tenant's ids, a viewer, and bad bodies change nothing."""

import pytest

from core.models import AuditEvent
from regions.models import Deployment
from routing import services
from tests.support.principals import principal
from tests.support.regions import tiny_version

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two_models(world, make_region, tiny_model_dir, api):  # type: ignore[no-untyped-def]
    make_region("eu-west-1", "EU")
    tiny_version(principal(world.operator), tiny_model_dir)
    alice = api(world.alice)
    for name in ("chat", "small"):
        body = {"owner": "acme", "name": name, "model": "platform/tiny-llama", "version": "1.0.0"}
        assert alice.post("/api/v1/deployments/", body, format="json").status_code == 201
    return world


def test_a_tenant_sets_fallbacks_and_the_route_table_carries_them(two_models, api):
    reply = api(two_models.alice).put(
        "/api/v1/deployments/acme/chat/fallbacks/", {"fallbacks": ["small"]}, format="json"
    )
    assert reply.status_code == 200 and reply.json()["fallbacks"] == ["small"]
    assert AuditEvent.objects.filter(action="deployment.fallbacks_set").count() == 1
    table = services.publish().body
    assert table["tenants"]["acme"]["models"]["chat"]["fallbacks"] == ["small"]
    assert "chat" not in table["tenants"]["globex"]["models"]
    cleared = api(two_models.alice).put(
        "/api/v1/deployments/acme/chat/fallbacks/", {"fallbacks": []}, format="json"
    )
    assert cleared.json()["fallbacks"] == []


def test_another_tenant_and_a_viewer_cannot_set_fallbacks(two_models, api):
    path = "/api/v1/deployments/acme/chat/fallbacks/"
    assert api(two_models.bob).put(path, {"fallbacks": ["small"]}, format="json").status_code == 404
    assert api(two_models.vera).put(path, {"fallbacks": ["small"]}, format="json").status_code == 403
    assert Deployment.objects.get(name="chat").fallbacks == []


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"fallbacks": ["chat"]}, 400),  # itself
        ({"fallbacks": ["small", "small"]}, 400),
        ({"fallbacks": ["nobody-runs-this"]}, 400),
        ({"fallbacks": ["a", "b", "c", "d", "e", "f"]}, 400),
        ({"fallbacks": "small"}, 400),
        ({"fallbacks": [1]}, 400),
        ({"fallbacks": ["sm\x00all"]}, 400),
        ({"fallbacks": ["../etc"]}, 400),
        ({}, 400),
        ({"fallbacks": ["small"], "surprise": True}, 400),
    ],
)
def test_bad_fallbacks_are_refused_and_write_nothing(two_models, api, body, status):
    reply = api(two_models.alice).put("/api/v1/deployments/acme/chat/fallbacks/", body, format="json")
    assert reply.status_code == status, reply.content
    assert set(reply.json()) == {"error"}
    assert Deployment.objects.get(name="chat").fallbacks == []


def test_another_tenants_deployment_name_is_no_fallback(two_models, api, make_region):  # type: ignore[no-untyped-def]
    make_region("us-east-1", "US")
    body = {"owner": "globex", "name": "theirs", "model": "platform/tiny-llama", "version": "1.0.0"}
    assert api(two_models.bob).post("/api/v1/deployments/", body, format="json").status_code == 201
    reply = api(two_models.alice).put(
        "/api/v1/deployments/acme/chat/fallbacks/", {"fallbacks": ["theirs"]}, format="json"
    )
    assert reply.status_code == 400 and "No deployment named theirs" in reply.json()["error"]["message"]
