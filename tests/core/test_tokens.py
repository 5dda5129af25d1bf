"""API tokens: shown once, stored as a hash, expiring, revocable, limited by scopes and by role."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from core.models import ApiToken, AuditEvent
from core.services.tokens import token_digest
from tests.support.principals import mint


def test_created_token_secret_is_returned_once_and_only_its_hash_is_stored(world, api):
    response = api(world.alice).post(
        "/api/v1/tokens/", {"name": "laptop", "scopes": ["tenants:read"]}, format="json"
    )
    assert response.status_code == 201
    secret = response.json()["secret"]
    token = ApiToken.objects.get(name="laptop")
    assert secret.startswith(f"cpt_{token.prefix}_") and len(secret) > 40
    assert token.digest == token_digest(secret)
    assert secret not in str(ApiToken.objects.filter(pk=token.pk).values().get())
    assert "secret" not in api(world.alice).get(f"/api/v1/tokens/{token.pk}/").json()
    event = AuditEvent.objects.get(action="token.created", target_id=str(token.pk))
    assert secret not in str(event.after) and event.after["prefix"] == token.prefix


def test_token_authenticates_and_records_last_use(world, api):
    secret = mint(world.alice, ["tenants:read"])
    assert api(secret=secret).get("/api/v1/me/").json()["name"] == "alice"
    assert ApiToken.objects.get(digest=token_digest(secret)).last_used_at is not None


@pytest.mark.parametrize("tampered", ["cpt_deadbeef_nope", "not-a-token", ""])
def test_unknown_or_malformed_tokens_are_401(world, api, tampered):
    response = api(secret=tampered or "cpt_").get("/api/v1/tenants/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"


def test_expired_token_is_401(world, api):
    secret = mint(world.alice, ["tenants:read"])
    ApiToken.objects.filter(digest=token_digest(secret)).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = api(secret=secret).get("/api/v1/tenants/")
    assert response.status_code == 401 and "expired" in response.json()["error"]["message"]


def test_revoked_token_is_401_and_revocation_is_audited_once(world, api):
    secret = mint(world.alice, ["tenants:read"])
    token = ApiToken.objects.get(digest=token_digest(secret))
    revoke = api(world.alice).post(f"/api/v1/tokens/{token.pk}/revoke/")
    assert revoke.status_code == 200 and revoke.json()["revoked_at"]
    assert api(secret=secret).get("/api/v1/tenants/").status_code == 401
    assert api(world.alice).post(f"/api/v1/tokens/{token.pk}/revoke/").status_code == 409
    assert AuditEvent.objects.filter(action="token.revoked", target_id=str(token.pk)).count() == 1


def test_deactivated_owner_token_is_401(world, api):
    secret = mint(world.alice, ["tenants:read"])
    world.alice.is_active = False
    world.alice.save()
    assert api(secret=secret).get("/api/v1/tenants/").status_code == 401


def test_missing_scope_is_403(world, api):
    client = api(world.admin, ["tenants:read"])
    assert client.get("/api/v1/tenants/").status_code == 200
    response = client.post("/api/v1/tenants/", {"slug": "x", "name": "X", "residency": ["EU"]}, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["detail"] == {"scope": "tenants:write"}
    assert client.get("/api/v1/audit-events/").status_code == 403


def test_token_cannot_hold_scopes_its_owner_lacks(world, api):
    response = api(world.dave).post(
        "/api/v1/tokens/", {"name": "x", "scopes": ["tenants:write"]}, format="json"
    )
    assert response.status_code == 403
    assert "tenants:write" in response.json()["error"]["message"]
    unknown = api(world.dave).post(
        "/api/v1/tokens/", {"name": "x", "scopes": ["root:everything"]}, format="json"
    )
    assert unknown.status_code == 400


def test_token_power_shrinks_when_the_owner_loses_a_role(world, api):
    secret = mint(world.alice, ["tenants:read", "members:write"])
    world.alice.memberships.update(role="viewer")
    add = api(secret=secret).post(
        "/api/v1/tenants/acme/members/", {"username": "bob", "role": "viewer"}, format="json"
    )
    assert add.status_code == 403


def test_tenant_admin_mints_robot_token_within_robot_role(world, api):
    client = api(world.alice)
    ok = client.post(
        "/api/v1/tokens/",
        {"name": "ci", "scopes": ["registry:write"], "service_account": world.robot_a.pk},
        format="json",
    )
    assert ok.status_code == 201
    too_much = client.post(
        "/api/v1/tokens/",
        {"name": "ci", "scopes": ["members:write"], "service_account": world.robot_a.pk},
        format="json",
    )
    assert too_much.status_code == 403  # a developer robot cannot manage members
    dev = api(world.dave).post(
        "/api/v1/tokens/",
        {"name": "ci", "scopes": ["registry:read"], "service_account": world.robot_a.pk},
        format="json",
    )
    assert dev.status_code == 403  # developers do not hold tokens:write


def test_expiry_in_the_past_is_400(world, api):
    response = api(world.alice).post(
        "/api/v1/tokens/",
        {"name": "x", "scopes": ["tenants:read"], "expires_at": "2001-01-01T00:00:00Z"},
        format="json",
    )
    assert response.status_code == 400


def test_create_token_command_prints_only_the_secret(world, capsys):
    call_command(
        "create_token",
        "--service-account",
        "acme/deployer",
        "--role",
        "developer",
        "--scopes",
        "registry:read,registry:write",
    )
    out = capsys.readouterr().out.strip()
    assert out.startswith("cpt_") and "\n" not in out
    token = ApiToken.objects.get(digest=token_digest(out))
    assert str(token.service_account) == "acme/deployer" and token.scopes == [
        "registry:read",
        "registry:write",
    ]
