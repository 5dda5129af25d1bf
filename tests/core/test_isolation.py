"""Tenant A's people can neither see nor change tenant B's objects: through every endpoint and page.

Objects they may not see answer 404 (their existence is not revealed); actions on objects they can see
but may not change answer 403. Lists and creates are tested too, since DRF skips object permissions there.
"""

import pytest

from core.models import ApiToken, AuditEvent, Membership, ServiceAccount, Tenant
from core.services.audit import audit_record
from core.services.tokens import token_create
from tests.support.principals import mint, principal, system


@pytest.fixture
def b_objects(world):
    """Things that belong to tenant B: a robot token, an audit event, an operation."""
    token_create(
        actor=principal(world.bob), name="b-ci", scopes=["registry:read"], service_account=world.robot_b
    )
    token = ApiToken.objects.get(name="b-ci")
    from core.services.operations import operation_start

    operation = operation_start(actor=principal(world.bob), kind="audit.verify", tenant=world.tenant_b)
    return {"token": token, "operation": operation}


# --- API: reads ---------------------------------------------------------------------------------


def test_tenant_list_and_detail(world, api):
    client = api(world.alice)
    assert [t["slug"] for t in client.get("/api/v1/tenants/").json()["results"]] == ["acme"]
    assert client.get("/api/v1/tenants/globex/").status_code == 404
    assert client.get("/api/v1/tenants/acme/").status_code == 200


def test_members(world, api):
    client = api(world.alice)
    assert client.get("/api/v1/tenants/globex/members/").status_code == 404
    members = {m["username"] for m in client.get("/api/v1/tenants/acme/members/").json()}
    assert members == {"alice", "dave", "vera"}


def test_users(world, api):
    names = {u["username"] for u in api(world.alice).get("/api/v1/users/").json()["results"]}
    assert names == {"alice", "dave", "vera"}
    assert api(world.alice).get("/api/v1/users/bob/").status_code == 404
    assert api(world.auditor).get("/api/v1/users/bob/").status_code == 200


def test_service_accounts(world, api):
    client = api(world.alice)
    listed = client.get("/api/v1/service-accounts/").json()["results"]
    assert {(r["tenant"], r["name"]) for r in listed} == {("acme", "ci")}
    assert client.get(f"/api/v1/service-accounts/{world.robot_b.pk}/").status_code == 404


def test_tokens(world, api, b_objects):
    client = api(world.alice)
    listed = {t["name"] for t in client.get("/api/v1/tokens/").json()["results"]}
    assert "b-ci" not in listed
    assert client.get(f"/api/v1/tokens/{b_objects['token'].pk}/").status_code == 404


def test_audit_events(world, api):
    audit_record(actor=system(), action="test.a", tenant=world.tenant_a)
    audit_record(actor=system(), action="test.b", tenant=world.tenant_b)
    audit_record(actor=system(), action="test.platform")
    client = api(world.alice)
    actions = {e["action"] for e in client.get("/api/v1/audit-events/?page_size=500").json()["results"]}
    assert "test.a" in actions and "test.b" not in actions and "test.platform" not in actions
    exported = client.get("/api/v1/audit-events/export/")
    text = b"".join(exported.streaming_content).decode()
    assert '"test.a"' in text and '"test.b"' not in text
    everything = api(world.auditor).get("/api/v1/audit-events/?page_size=500").json()["results"]
    assert {"test.a", "test.b", "test.platform"} <= {e["action"] for e in everything}


def test_audit_needs_audit_scope(world, api):
    assert api(world.dave).get("/api/v1/audit-events/").status_code == 403  # developers lack audit:read


def test_operations(world, api, b_objects):
    client = api(world.alice)
    assert client.get(f"/api/v1/operations/{b_objects['operation'].pk}/").status_code == 404
    assert client.get("/api/v1/operations/").json()["count"] == 0
    assert api(world.bob).get(f"/api/v1/operations/{b_objects['operation'].pk}/").status_code == 200


# --- API: writes --------------------------------------------------------------------------------


def test_cannot_change_another_tenant(world, api):
    client = api(world.alice)
    assert client.patch("/api/v1/tenants/globex/", {"name": "x"}, format="json").status_code == 404
    assert (
        client.patch("/api/v1/tenants/acme/", {"name": "x"}, format="json").status_code == 403
    )  # tenants:write
    assert Tenant.objects.get(slug="globex").name != "x"


def test_cannot_manage_members_of_another_tenant(world, api):
    client = api(world.alice)
    add = client.post(
        "/api/v1/tenants/globex/members/", {"username": "alice", "role": "admin"}, format="json"
    )
    assert add.status_code == 404
    assert client.delete("/api/v1/tenants/globex/members/bob/").status_code == 404
    assert Membership.objects.filter(tenant=world.tenant_b, user=world.alice).count() == 0
    assert Membership.objects.filter(tenant=world.tenant_b, user=world.bob).count() == 1


def test_roles_limit_member_management_within_a_tenant(world, api):
    add = api(world.dave).post(
        "/api/v1/tenants/acme/members/", {"username": "bob", "role": "admin"}, format="json"
    )
    assert add.status_code == 403
    ok = api(world.alice).post(
        "/api/v1/tenants/acme/members/", {"username": "vera", "role": "developer"}, format="json"
    )
    assert ok.status_code == 200  # another tenant's user needs an invitation: test_invitations.py
    assert api(world.alice).delete("/api/v1/tenants/acme/members/vera/").status_code == 204


def test_cannot_create_service_account_in_another_tenant(world, api):
    response = api(world.alice).post(
        "/api/v1/service-accounts/", {"name": "x", "tenant": "globex", "role": "admin"}, format="json"
    )
    assert response.status_code == 404
    assert not ServiceAccount.objects.filter(name="x").exists()


def test_cannot_mint_or_revoke_tokens_for_another_tenant(world, api, b_objects):
    client = api(world.alice)
    mint_b = client.post(
        "/api/v1/tokens/",
        {"name": "x", "scopes": ["registry:read"], "service_account": world.robot_b.pk},
        format="json",
    )
    assert mint_b.status_code == 404
    assert client.post(f"/api/v1/tokens/{b_objects['token'].pk}/revoke/").status_code == 404
    assert ApiToken.objects.get(pk=b_objects["token"].pk).revoked_at is None


def test_cannot_create_tenants_or_users_without_platform_role(world, api):
    client = api(world.alice)
    tenant = client.post("/api/v1/tenants/", {"slug": "x", "name": "X", "residency": ["EU"]}, format="json")
    assert tenant.status_code == 403
    assert client.post("/api/v1/users/", {"username": "mallory"}, format="json").status_code == 403
    assert not Tenant.objects.filter(slug="x").exists()


def test_robot_token_is_limited_to_its_tenant(world, api):
    _, secret = token_create(
        actor=principal(world.alice), name="ci", scopes=["tenants:read"], service_account=world.robot_a
    )
    client = api(secret=secret)
    assert [t["slug"] for t in client.get("/api/v1/tenants/").json()["results"]] == ["acme"]
    assert client.get("/api/v1/tenants/globex/").status_code == 404


def test_auditor_reads_everything_and_changes_nothing(world, api):
    client = api(world.auditor)
    assert {t["slug"] for t in client.get("/api/v1/tenants/").json()["results"]} == {"acme", "globex"}
    assert client.patch("/api/v1/tenants/acme/", {"name": "x"}, format="json").status_code == 403
    add = client.post("/api/v1/tenants/acme/members/", {"username": "alice", "role": "viewer"}, format="json")
    assert add.status_code == 403


# --- Dashboard pages ----------------------------------------------------------------------------


@pytest.fixture
def as_alice(client, world):
    client.force_login(world.alice)
    return client


def test_pages_show_only_own_tenant(as_alice, world):
    assert b"globex" not in as_alice.get("/tenants/").content
    assert as_alice.get("/tenants/globex/").status_code == 404
    assert as_alice.get("/tenants/globex/edit/").status_code == 404
    assert as_alice.get("/tenants/acme/").status_code == 200
    assert as_alice.get("/tenants/acme/edit/").status_code == 403
    assert b"bob" not in as_alice.get("/users/").content
    assert as_alice.get("/tenants/new/").status_code == 403


def test_the_users_page_shows_only_memberships_of_tenants_one_may_see(as_alice, world):
    """Dave is in both tenants: alice (acme) sees him, but not that he belongs to globex."""
    from tests.support.factories import MembershipFactory

    MembershipFactory(user=world.dave, tenant=world.tenant_b, role="viewer")
    page = as_alice.get("/users/").content.decode()
    assert "dave" in page and "acme: developer" in page
    assert "globex" not in page


def test_page_actions_on_another_tenant_are_refused(as_alice, world, b_objects):
    assert (
        as_alice.post("/tenants/globex/members/", {"username": "alice", "role": "admin"}).status_code == 404
    )
    assert as_alice.post("/tenants/globex/members/bob/remove/").status_code == 404
    assert (
        as_alice.post("/tenants/globex/service-accounts/", {"name": "x", "role": "admin"}).status_code == 404
    )
    assert as_alice.post(f"/tokens/{b_objects['token'].pk}/revoke/").status_code == 404
    assert as_alice.get(f"/operations/{b_objects['operation'].pk}/").status_code == 404
    assert Membership.objects.filter(tenant=world.tenant_b).count() == 1
    assert ApiToken.objects.get(pk=b_objects["token"].pk).revoked_at is None


def test_token_page_lists_only_own_and_managed_tokens(as_alice, world, b_objects):
    mint(world.alice, ["tenants:read"])
    page = as_alice.get("/tokens/").content.decode()
    assert b_objects["token"].prefix not in page
    assert "test" in page


def test_audit_page_is_scoped(as_alice, world):
    audit_record(actor=system(), action="secret.of.globex", tenant=world.tenant_b)
    audit_record(actor=system(), action="visible.to.acme", tenant=world.tenant_a)
    page = as_alice.get("/audit/").content.decode()
    assert "visible.to.acme" in page and "secret.of.globex" not in page
    assert as_alice.post("/audit/verify/").status_code == 403  # the whole chain is for platform auditors


def test_pages_need_login(client, world):
    for path in ["/", "/tenants/", "/tenants/acme/", "/users/", "/tokens/", "/audit/", "/registry/"]:
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/login/"), path


def test_developer_without_audit_scope_gets_403_page(client, world):
    client.force_login(world.dave)
    assert client.get("/audit/").status_code == 403


def test_platform_role_changes_need_users_write(world, api):
    assert (
        api(world.alice).patch("/api/v1/users/dave/", {"platform_role": "admin"}, format="json").status_code
        == 403
    )
    assert (
        api(world.alice).patch("/api/v1/users/bob/", {"platform_role": "admin"}, format="json").status_code
        == 404
    )
    response = api(world.admin).patch("/api/v1/users/dave/", {"platform_role": "auditor"}, format="json")
    assert response.status_code == 200 and response.json()["platform_role"] == "auditor"
    event = AuditEvent.objects.get(action="user.platform_role_set")
    assert event.before == {"platform_role": ""} and event.after == {"platform_role": "auditor"}


def test_overview_counts_only_what_the_user_may_see(as_alice, world):
    page = as_alice.get("/").content.decode()
    tenants_card = page.split("Tenants</span>")[0].rsplit('class="num">', 1)[1]
    assert tenants_card.startswith("1<")
