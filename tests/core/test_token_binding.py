"""A token used at the gateway is bound to one tenant at creation; joining another tenant never breaks it."""

import importlib

import pytest
from django.apps import apps

from core.choices import Scope, TenantRole
from core.errors import ValidationFailed
from core.models import ApiToken
from core.services.tokens import token_create, token_digest
from gateway.config import RouteCache, Settings
from routing import selectors as routing
from tests.support.factories import MembershipFactory
from tests.support.principals import principal

INVOKE = [Scope.MODELS_INVOKE]


def _gateway_tenant(secret: str, organization: str | None = None) -> str | None:
    cache = RouteCache(settings=Settings(control_plane="http://cp", token="", cache_file=None))
    cache.body = {"credentials": routing.credentials()}
    return cache.tenant_of(token_digest(secret), organization)


def test_a_one_tenant_users_invoke_token_is_bound_to_that_tenant(world):
    token, secret = token_create(actor=principal(world.alice), name="app", scopes=INVOKE)
    assert token.tenant == world.tenant_a
    assert routing.credentials()[token.digest]["tenants"] == ["acme"]
    assert _gateway_tenant(secret) == "acme"


def test_joining_a_second_tenant_does_not_break_a_gateway_token(world):
    _, secret = token_create(actor=principal(world.bob), name="app", scopes=INVOKE)
    MembershipFactory(user=world.bob, tenant=world.tenant_a, role=TenantRole.DEVELOPER)
    assert _gateway_tenant(secret) == "globex"  # no OpenAI-Organization needed
    assert _gateway_tenant(secret, "acme") is None  # and it never reaches the other tenant


def test_a_user_of_several_tenants_must_name_the_tenant(world):
    MembershipFactory(user=world.bob, tenant=world.tenant_a, role=TenantRole.DEVELOPER)
    with pytest.raises(ValidationFailed, match="bound to one tenant"):
        token_create(actor=principal(world.bob), name="app", scopes=INVOKE)
    _, secret = token_create(actor=principal(world.bob), name="app", scopes=INVOKE, tenant=world.tenant_a)
    assert _gateway_tenant(secret) == "acme"


def test_binding_over_the_api_and_cross_tenant(world, api):
    MembershipFactory(user=world.bob, tenant=world.tenant_a, role=TenantRole.VIEWER)
    bob = api()
    bob.force_login(world.bob)  # the console's session: all of bob's roles
    unbound = bob.post("/api/v1/tokens/", {"name": "x", "scopes": INVOKE}, format="json")
    assert unbound.status_code == 400 and "tenant" in unbound.json()["error"]["detail"]
    bound = bob.post("/api/v1/tokens/", {"name": "x", "scopes": INVOKE, "tenant": "globex"}, format="json")
    assert bound.status_code == 201 and bound.json()["tenant"] == "globex"
    # a viewer of acme holds no models:invoke there, so the token cannot get it
    acme = bob.post("/api/v1/tokens/", {"name": "x", "scopes": INVOKE, "tenant": "acme"}, format="json")
    assert acme.status_code == 403
    # alice cannot bind a token to a tenant she does not belong to (not revealed: 404)
    alice = api(world.alice)
    other = alice.post("/api/v1/tokens/", {"name": "x", "scopes": INVOKE, "tenant": "globex"}, format="json")
    assert other.status_code == 404


def test_a_bound_token_acts_only_in_its_tenant(world, api):
    MembershipFactory(user=world.bob, tenant=world.tenant_a, role=TenantRole.ADMIN)
    _, secret = token_create(
        actor=principal(world.bob), name="g", scopes=["tenants:read"], tenant=world.tenant_b
    )
    client = api(secret=secret)
    assert client.get("/api/v1/tenants/globex/").status_code == 200
    assert client.get("/api/v1/tenants/acme/").status_code == 404
    assert client.get("/api/v1/me/").json()["tenants"] == {"globex": "admin"}


def test_robot_tokens_are_bound_to_the_robots_tenant(world):
    token, _ = token_create(
        actor=principal(world.alice), name="ci", scopes=INVOKE, service_account=world.robot_a
    )
    assert token.tenant == world.tenant_a
    with pytest.raises(ValidationFailed):
        token_create(
            actor=principal(world.alice),
            name="ci",
            scopes=INVOKE,
            service_account=world.robot_a,
            tenant=world.tenant_b,
        )


def test_the_migration_binds_unambiguous_tokens_and_leaves_the_others(world):
    migration = importlib.import_module("core.migrations.0007_bind_existing_tokens")
    MembershipFactory(user=world.bob, tenant=world.tenant_a, role=TenantRole.DEVELOPER)
    alice, _ = token_create(actor=principal(world.alice), name="a", scopes=["tenants:read"])
    bob, _ = token_create(
        actor=principal(world.bob), name="b", scopes=["tenants:read"], tenant=world.tenant_b
    )
    robot, _ = token_create(
        actor=principal(world.alice), name="r", scopes=["registry:read"], service_account=world.robot_a
    )
    admin, _ = token_create(actor=principal(world.admin), name="p", scopes=["tenants:read"])
    ApiToken.objects.update(tenant=None)  # as before the migration

    migration.bind(apps, None)

    bound = dict(ApiToken.objects.values_list("pk", "tenant__slug"))
    assert bound == {alice.pk: "acme", bob.pk: None, robot.pk: "acme", admin.pk: None}
    assert all(d["tenants"] in (["acme"],) for d in routing.credentials().values())


def test_the_console_binds_a_token_to_the_chosen_tenant(world, client):
    MembershipFactory(user=world.bob, tenant=world.tenant_a, role=TenantRole.DEVELOPER)
    client.force_login(world.bob)
    form = {"name": "app", "owner": "me", "scopes": ["models:invoke"], "expires_in_days": 30}
    refused = client.post("/tokens/", form)
    assert refused.status_code == 400 and "bound to one tenant" in refused.content.decode()
    created = client.post("/tokens/", {**form, "tenant": "acme"})
    assert created.status_code == 200
    assert ApiToken.objects.get(name="app").tenant == world.tenant_a
    # a tenant the user does not belong to is not offered, and not accepted
    assert client.post("/tokens/", {**form, "name": "x", "tenant": "nowhere"}).status_code == 400


def test_a_bound_token_cannot_mint_its_way_out_of_its_tenant(world, api):
    """A token bound to globex mints tokens bound to globex only, never an unbound one reaching acme."""
    MembershipFactory(user=world.bob, tenant=world.tenant_a, role=TenantRole.ADMIN)
    _, secret = token_create(
        actor=principal(world.bob),
        name="g",
        scopes=["deployments:write", "tenants:read"],
        tenant=world.tenant_b,
    )
    client = api(secret=secret)
    minted = client.post("/api/v1/tokens/", {"name": "x", "scopes": ["tenants:read"]}, format="json")
    assert minted.status_code == 201, minted.content
    assert minted.json()["tenant"] == "globex"
    escaped = api(secret=minted.json()["secret"])
    assert escaped.get("/api/v1/tenants/acme/").status_code == 404
    other = client.post(
        "/api/v1/tokens/", {"name": "x", "scopes": ["tenants:read"], "tenant": "acme"}, format="json"
    )
    assert other.status_code in (400, 404)
    assert not ApiToken.objects.filter(user=world.bob, tenant__isnull=True).exists()


def test_every_personal_token_of_a_tenant_member_is_bound(world):
    """Not only models:invoke tokens: a one-tenant user's read token is bound too (as migration 0007 does)."""
    token, _ = token_create(actor=principal(world.alice), name="r", scopes=["tenants:read"])
    assert token.tenant == world.tenant_a
    MembershipFactory(user=world.bob, tenant=world.tenant_a, role=TenantRole.ADMIN)
    with pytest.raises(ValidationFailed, match="name the tenant"):
        token_create(actor=principal(world.bob), name="r", scopes=["tenants:read"])


def test_only_platform_principals_mint_unbound_tokens(world):
    token, _ = token_create(actor=principal(world.admin), name="p", scopes=["tenants:read"])
    assert token.tenant is None


def test_a_personal_token_is_bound_only_to_a_tenant_its_owner_belongs_to(world):
    """A platform operator holds every scope, but a gateway token of theirs needs membership (11.2)."""
    with pytest.raises(ValidationFailed, match="member"):
        token_create(actor=principal(world.operator), name="app", scopes=INVOKE, tenant=world.tenant_a)
    MembershipFactory(user=world.operator, tenant=world.tenant_a, role=TenantRole.DEVELOPER)
    token, _ = token_create(actor=principal(world.operator), name="app", scopes=INVOKE, tenant=world.tenant_a)
    assert token.tenant == world.tenant_a


def test_a_bound_tokens_own_things_are_those_of_its_tenant(world, api):
    """A token bound to globex lists and revokes only bob's globex tokens, and reads only the operations
    bob started in globex, not those he started in acme."""
    from core.services.operations import operation_start
    from core.services.tokens import may_manage_token

    MembershipFactory(user=world.bob, tenant=world.tenant_a, role=TenantRole.VIEWER)
    in_a, _ = token_create(
        actor=principal(world.bob), name="a", scopes=["tenants:read"], tenant=world.tenant_a
    )
    in_b, secret = token_create(
        actor=principal(world.bob), name="b", scopes=["tenants:read"], tenant=world.tenant_b
    )
    op_a = operation_start(actor=principal(world.bob), kind="audit.verify", tenant=world.tenant_a)
    client = api(secret=secret)
    listed = {t["id"] for t in client.get("/api/v1/tokens/").json()["results"]}
    assert in_b.pk in listed and in_a.pk not in listed
    assert client.post(f"/api/v1/tokens/{in_a.pk}/revoke/").status_code == 404
    assert not may_manage_token(_bound(in_b, world.bob), in_a)
    assert client.get(f"/api/v1/operations/{op_a.pk}/").status_code == 404
    assert str(op_a.pk) not in {o["id"] for o in client.get("/api/v1/operations/").json()["results"]}


def _bound(token, user):
    from core.choices import AuditSource
    from core.principal import Principal

    return Principal.for_user(user, source=AuditSource.API, token=token)


def test_a_platform_token_stays_a_platform_token_when_its_owner_joins_a_tenant(world, api):
    """Joining another tenant later never changes a token's tenant: an unbound (platform) token does not
    gain the owner's new membership."""
    _, secret = token_create(actor=principal(world.auditor), name="p", scopes=["tenants:read"])
    MembershipFactory(user=world.auditor, tenant=world.tenant_a, role=TenantRole.ADMIN)
    assert api(secret=secret).get("/api/v1/me/").json()["tenants"] == {}


def test_the_console_mints_a_batch_token_and_shows_it_and_refuses_an_unknown_priority(world, client):
    client.force_login(world.alice)
    form = {
        "name": "nightly",
        "owner": "me",
        "scopes": ["models:invoke"],
        "tenant": "acme",
        "priority": "batch",
    }
    created = client.post("/tokens/", form)
    assert created.status_code == 200 and "batch priority" in created.content.decode()
    assert ApiToken.objects.get(name="nightly").priority == "batch"
    refused = client.post("/tokens/", {**form, "name": "x", "priority": "urgent"})
    assert refused.status_code == 400 and not ApiToken.objects.filter(name="x").exists()
