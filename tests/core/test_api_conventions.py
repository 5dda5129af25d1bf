"""Error envelope, strict input, ETag/If-Match, Idempotency-Key, pagination, throttling, schema."""

import json

import pytest
import yaml
from django.core.cache import cache
from openapi_spec_validator import validate

from core.models import AuditEvent, IdempotencyRecord, Tenant
from tests.support.envelope import assert_envelope

NEW_TENANT = {"slug": "initech", "name": "Initech", "residency": ["UK"]}


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({**NEW_TENANT, "slug": "Not A Slug!"}, "slug"),
        ({**NEW_TENANT, "residency": ["EU", "XX"]}, "residency"),
        ({**NEW_TENANT, "residency": "EU"}, "residency"),
        ({**NEW_TENANT, "residency": []}, "residency"),
        ({**NEW_TENANT, "name": "x" * 201}, "name"),
        ({**NEW_TENANT, "max_gpus": "many"}, "max_gpus"),
        ({**NEW_TENANT, "max_gpus": -1}, "max_gpus"),
        ({**NEW_TENANT, "monthly_budget": "-5"}, "monthly_budget"),
        ({**NEW_TENANT, "colour": "blue"}, "colour"),
        ({"name": "No slug", "residency": ["EU"]}, "slug"),
    ],
)
def test_bad_tenant_input_is_400_naming_the_field_and_writes_nothing(world, api, payload, field):
    client = api(world.admin)
    events_before = AuditEvent.objects.count()
    error = assert_envelope(client.post("/api/v1/tenants/", payload, format="json"), 400, "invalid")
    assert field in error["detail"]
    assert field in error["message"]
    assert not Tenant.objects.filter(slug=payload.get("slug", "")).exists()
    assert AuditEvent.objects.count() == events_before


def test_malformed_json_is_400(world, api):
    response = api(world.admin).post("/api/v1/tenants/", data="{not json", content_type="application/json")
    assert_envelope(response, 400, "malformed_request")


def test_wrong_content_type_is_415(world, api):
    response = api(world.admin).post("/api/v1/tenants/", data="slug=x", content_type="text/plain")
    assert_envelope(response, 415, "unsupported_media_type")


def test_duplicate_slug_is_409(world, api):
    response = api(world.admin).post("/api/v1/tenants/", {**NEW_TENANT, "slug": "acme"}, format="json")
    assert_envelope(response, 409, "already_exists")


def test_unknown_api_path_is_404_envelope(world, api):
    assert_envelope(api(world.admin).get("/api/v1/nothing-here/"), 404, "not_found")


def test_unauthenticated_is_401_with_bearer_challenge(world, api):
    response = api().get("/api/v1/tenants/")
    assert_envelope(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_create_tenant_writes_one_audit_event(world, api):
    client = api(world.admin)
    before = AuditEvent.objects.count()
    response = client.post("/api/v1/tenants/", NEW_TENANT, format="json")
    assert response.status_code == 201
    assert response["Location"].endswith("/api/v1/tenants/initech/")
    assert AuditEvent.objects.count() == before + 1
    event = AuditEvent.objects.get(action="tenant.created")
    assert event.after["residency"] == ["UK"] and event.actor_name == "root" and event.source == "api"


def test_etag_and_if_match_detect_lost_updates(world, api):
    client = api(world.admin)
    etag = client.get("/api/v1/tenants/acme/")["ETag"]
    first = client.patch("/api/v1/tenants/acme/", {"name": "Acme One"}, format="json", HTTP_IF_MATCH=etag)
    assert first.status_code == 200 and first["ETag"] != etag
    stale = client.patch("/api/v1/tenants/acme/", {"name": "Acme Two"}, format="json", HTTP_IF_MATCH=etag)
    assert_envelope(stale, 412, "precondition_failed")
    assert Tenant.objects.get(slug="acme").name == "Acme One"
    bogus = client.patch("/api/v1/tenants/acme/", {"name": "X"}, format="json", HTTP_IF_MATCH='"999-1"')
    assert_envelope(bogus, 412, "precondition_failed")


def test_patch_rejects_unknown_and_immutable_fields(world, api):
    client = api(world.admin)
    assert_envelope(client.patch("/api/v1/tenants/acme/", {"slug": "x"}, format="json"), 400, "invalid")
    assert_envelope(
        client.patch("/api/v1/tenants/acme/", {"residency": ["ZZ"]}, format="json"), 400, "invalid"
    )
    assert Tenant.objects.get(slug="acme").residency == ["EU", "CH"]


def test_idempotency_key_replays_same_request_and_rejects_a_different_body(world, api):
    client = api(world.admin)
    first = client.post("/api/v1/tenants/", NEW_TENANT, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = client.post("/api/v1/tenants/", NEW_TENANT, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Tenant.objects.filter(slug="initech").count() == 1
    assert AuditEvent.objects.filter(action="tenant.created", tenant_slug="initech").count() == 1
    other = client.post(
        "/api/v1/tenants/", {**NEW_TENANT, "name": "Other"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert_envelope(other, 422, "idempotency_key_reused")


def test_idempotency_keys_are_per_principal(world, api):
    api(world.admin).post("/api/v1/tenants/", NEW_TENANT, format="json", HTTP_IDEMPOTENCY_KEY="shared")
    response = api(world.operator).post(
        "/api/v1/tenants/", {**NEW_TENANT, "slug": "other"}, format="json", HTTP_IDEMPOTENCY_KEY="shared"
    )
    assert response.status_code == 403  # operators may not create tenants; the key did not replay
    assert IdempotencyRecord.objects.count() == 1


def test_failed_actions_are_not_remembered_under_their_key(world, api):
    client = api(world.admin)
    bad = client.post(
        "/api/v1/tenants/", {**NEW_TENANT, "slug": "acme"}, format="json", HTTP_IDEMPOTENCY_KEY="k"
    )
    assert bad.status_code == 409
    good = client.post("/api/v1/tenants/", NEW_TENANT, format="json", HTTP_IDEMPOTENCY_KEY="k2")
    assert good.status_code == 201


def test_pagination_and_ordering(world, api):
    for n in range(5):
        Tenant.objects.create(slug=f"t{n}", name=f"T{n}", residency=["EU"])
    page = api(world.admin).get("/api/v1/tenants/?page_size=3&ordering=-slug").json()
    assert page["count"] == 7 and len(page["results"]) == 3 and page["next"]
    assert [t["slug"] for t in page["results"]] == ["t4", "t3", "t2"]


def test_throttling_is_per_token(world, api, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"principal": "3/min"}}
    from rest_framework.settings import api_settings
    from rest_framework.throttling import SimpleRateThrottle

    cache.clear()
    SimpleRateThrottle.THROTTLE_RATES = api_settings.DEFAULT_THROTTLE_RATES
    try:
        first, second = api(world.admin), api(world.admin)
        codes = [first.get("/api/v1/tenants/").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        assert_envelope(first.get("/api/v1/tenants/"), 429, "rate_limited")
        assert second.get("/api/v1/tenants/").status_code == 200  # another token has its own budget
    finally:
        settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK}
        SimpleRateThrottle.THROTTLE_RATES = {"principal": "1200/min"}
        cache.clear()


def test_openapi_schema_generates_without_warnings(db, tmp_path):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))


def test_openapi_schema_validates(world, api):
    response = api(world.admin).get("/api/schema/")
    assert response.status_code == 200
    spec = yaml.safe_load(response.content)
    validate(spec)
    assert "/api/v1/tenants/" in spec["paths"]
    assert "/api/v1/audit-events/verify/" in spec["paths"]


def test_interactive_docs_are_served_locally(world, client):
    client.force_login(world.admin)
    html = client.get("/api/docs/").content.decode()
    assert "swagger-ui" in html
    assert "cdn" not in html.lower() and "unpkg" not in html.lower()
    asset = client.get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    assert asset.status_code == 200


def test_error_envelope_is_json_for_unexpected_server_errors(world, client, settings, monkeypatch):
    from core.api import views

    def boom(*args, **kwargs):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(views.selectors, "tenants_for", boom)
    client.raise_request_exception = False
    client.force_login(world.admin)
    response = client.get("/api/v1/tenants/")
    assert response.status_code == 500
    assert json.loads(response.content)["error"]["code"] == "server_error"
    assert "kaboom" not in response.content.decode()
