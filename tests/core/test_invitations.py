"""A tenant admin cannot pull another tenant's user in: they create users for their tenant or invite, and
only the invited user can accept. Platform admins may add anyone."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from core.choices import InvitationStatus, TenantRole
from core.models import AuditEvent, Invitation, Membership, User
from core.services.tenants import invitation_accept, invitation_create, invitations_expire
from tests.support.principals import principal


def _invite(client, username="bob", role="developer", tenant="acme"):
    return client.post(
        f"/api/v1/tenants/{tenant}/invitations/", {"username": username, "role": role}, format="json"
    )


def test_a_tenant_admin_cannot_add_another_tenants_user(world, api):
    reply = api(world.alice).post(
        "/api/v1/tenants/acme/members/", {"username": "bob", "role": "developer"}, format="json"
    )
    assert reply.status_code == 403
    assert reply.json()["error"]["code"] == "invitation_required"
    assert not Membership.objects.filter(user=world.bob, tenant=world.tenant_a).exists()
    assert api(world.alice).get("/api/v1/users/bob/").status_code == 404


def test_a_tenant_admin_still_changes_a_members_role(world, api):
    reply = api(world.alice).post(
        "/api/v1/tenants/acme/members/", {"username": "vera", "role": "developer"}, format="json"
    )
    assert reply.status_code == 200
    assert Membership.objects.get(user=world.vera).role == TenantRole.DEVELOPER


def test_a_platform_admin_may_add_anyone(world, api):
    reply = api(world.admin).post(
        "/api/v1/tenants/acme/members/", {"username": "bob", "role": "viewer"}, format="json"
    )
    assert reply.status_code == 200
    assert Membership.objects.filter(user=world.bob, tenant=world.tenant_a).exists()


def test_a_tenant_admin_creates_a_user_for_their_tenant(world, api):
    body = {"username": "newbie", "password": "correct-horse-battery-9", "tenant": "acme", "role": "viewer"}
    reply = api(world.alice).post("/api/v1/users/", body, format="json")
    assert reply.status_code == 201, reply.json()
    assert Membership.objects.get(user__username="newbie").tenant == world.tenant_a
    # ...but not for another tenant, and not a user without a tenant (that needs users:write)
    other = api(world.alice).post(
        "/api/v1/users/", {**body, "username": "x", "tenant": "globex"}, format="json"
    )
    assert other.status_code == 404
    bare = api(world.alice).post("/api/v1/users/", {"username": "y"}, format="json")
    assert bare.status_code == 403
    assert not User.objects.filter(username__in=["x", "y"]).exists()


def _session(api, user):
    """The invitee answers from the console's session (API calls with it included), never with a token."""
    client = api()
    client.force_login(user)
    return client


def test_invite_then_accept(world, api):
    created = _invite(api(world.alice))
    assert created.status_code == 201, created.json()
    invitation = created.json()
    assert invitation["status"] == "pending" and invitation["username"] == "bob"
    assert not Membership.objects.filter(user=world.bob, tenant=world.tenant_a).exists()

    bob = _session(api, world.bob)
    mine = bob.get("/api/v1/invitations/").json()["results"]
    assert [i["id"] for i in mine] == [invitation["id"]]
    accepted = bob.post(f"/api/v1/invitations/{invitation['id']}/accept/")
    assert accepted.status_code == 200
    assert accepted.json() == {**accepted.json(), "tenant": "acme", "username": "bob", "role": "developer"}
    assert Membership.objects.get(user=world.bob, tenant=world.tenant_a).role == TenantRole.DEVELOPER
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"invitation.created", "invitation.accepted", "membership.set"} <= actions
    assert bob.post(f"/api/v1/invitations/{invitation['id']}/accept/").status_code == 409


def test_decline(world, api):
    invitation = _invite(api(world.alice)).json()
    declined = _session(api, world.bob).post(f"/api/v1/invitations/{invitation['id']}/decline/")
    assert declined.status_code == 200 and declined.json()["status"] == "declined"
    assert not Membership.objects.filter(user=world.bob, tenant=world.tenant_a).exists()
    assert "invitation.declined" in set(AuditEvent.objects.values_list("action", flat=True))


def test_only_the_invited_user_answers(world, api):
    invitation = _invite(api(world.alice)).json()
    for someone in (world.alice, world.dave, world.admin):
        client = api(someone)
        assert client.get("/api/v1/invitations/").json()["results"] == []
        assert client.post(f"/api/v1/invitations/{invitation['id']}/accept/").status_code == 404
        assert client.post(f"/api/v1/invitations/{invitation['id']}/decline/").status_code == 404
    assert api(world.bob).post("/api/v1/invitations/not-a-number/accept/").status_code == 404
    assert Invitation.objects.get().status == InvitationStatus.PENDING


def test_no_token_of_the_invitee_can_answer(world, api):
    """An admin holding a weak token of the invitee (an app's models:invoke token, a CI token, a token
    bound to another tenant) cannot consent for them: only the person's console session answers."""
    invitation = _invite(api(world.alice)).json()
    weak = [["models:invoke"], ["tenants:read"], None]  # None: every scope bob holds (bound to globex)
    for scopes in weak:
        client = api(world.bob, scopes)
        for answer in ("accept", "decline"):
            refused = client.post(f"/api/v1/invitations/{invitation['id']}/{answer}/")
            assert refused.status_code == 403, (scopes, refused.content)
            assert refused.json()["error"]["code"] == "session_required"
    assert Invitation.objects.get().status == InvitationStatus.PENDING
    assert not Membership.objects.filter(user=world.bob, tenant=world.tenant_a).exists()
    assert _session(api, world.bob).post(f"/api/v1/invitations/{invitation['id']}/accept/").status_code == 200


def test_tenant_invitations_are_isolated(world, api):
    _invite(api(world.alice))
    assert api(world.bob).get("/api/v1/tenants/acme/invitations/").status_code == 404
    assert _invite(api(world.bob), username="vera", tenant="acme").status_code == 404
    assert api(world.dave).get("/api/v1/tenants/acme/invitations/").status_code == 403
    assert _invite(api(world.dave), username="bob").status_code in (403, 409)
    listed = api(world.alice).get("/api/v1/tenants/acme/invitations/").json()
    assert [i["username"] for i in listed] == ["bob"]
    assert api(world.bob).get("/api/v1/tenants/globex/invitations/").json() == []


def test_invitations_refuse_members_and_duplicates(world, api):
    assert _invite(api(world.alice), username="dave").status_code == 409
    assert _invite(api(world.alice)).status_code == 201
    assert _invite(api(world.alice)).status_code == 409
    assert _invite(api(world.alice), role="owner").status_code == 400


def test_an_invitation_expires(world):
    now = timezone.now()
    invitation = invitation_create(
        actor=principal(world.alice), tenant=world.tenant_a, user=world.bob, role="viewer", now=now
    )
    later = invitation.expires_at + timedelta(seconds=1)
    from core.errors import Conflict

    with pytest.raises(Conflict, match="expired"):
        invitation_accept(actor=principal(world.bob), invitation=invitation, now=later)
    invitation.refresh_from_db()
    assert invitation.status == InvitationStatus.PENDING  # a refused accept writes nothing
    assert invitations_expire(now=later) == 1  # the periodic sweep marks it
    invitation.refresh_from_db()
    assert invitation.status == InvitationStatus.EXPIRED
    assert not Membership.objects.filter(user=world.bob, tenant=world.tenant_a).exists()
    assert AuditEvent.objects.filter(action="invitation.expired").count() == 1
    # a new invitation can then be sent; the periodic sweep expires it too when due
    again = invitation_create(
        actor=principal(world.alice), tenant=world.tenant_a, user=world.bob, role="viewer", now=later
    )
    assert invitations_expire(now=later) == 0
    assert invitations_expire(now=again.expires_at) == 1


def test_console_add_member_invites_instead(world, client):
    client.force_login(world.alice)
    reply = client.post("/tenants/acme/members/", {"username": "bob", "role": "developer"}, follow=True)
    assert reply.status_code == 200
    assert "invited" in reply.content.decode().lower()
    assert not Membership.objects.filter(user=world.bob, tenant=world.tenant_a).exists()
    invitation = Invitation.objects.get(user=world.bob)

    client.force_login(world.bob)
    page = client.get("/invitations/")
    assert page.status_code == 200 and "acme" in page.content.decode()
    client.post(f"/invitations/{invitation.pk}/accept/")
    assert Membership.objects.filter(user=world.bob, tenant=world.tenant_a).exists()


def test_console_invitation_of_someone_else_is_not_found(world, client):
    invitation = invitation_create(
        actor=principal(world.alice), tenant=world.tenant_a, user=world.bob, role="viewer"
    )
    client.force_login(world.dave)
    assert client.post(f"/invitations/{invitation.pk}/accept/").status_code == 404
    assert "No invitations for you" in client.get("/invitations/").content.decode()
    invitation.refresh_from_db()
    assert invitation.status == InvitationStatus.PENDING


def test_one_service_decides_add_or_invite(world, client):
    """The console's add-member form and the API share one rule (services.tenants), not two copies."""
    from core.services.tenants import membership_add_or_invite

    invited = membership_add_or_invite(
        actor=principal(world.alice), tenant=world.tenant_a, user=world.bob, role="viewer"
    )
    assert isinstance(invited, Invitation) and invited.status == InvitationStatus.PENDING
    changed = membership_add_or_invite(
        actor=principal(world.alice), tenant=world.tenant_a, user=world.vera, role="developer"
    )
    assert isinstance(changed, Membership) and changed.role == TenantRole.DEVELOPER
    added = membership_add_or_invite(
        actor=principal(world.admin), tenant=world.tenant_b, user=world.dave, role="viewer"
    )
    assert isinstance(added, Membership) and added.tenant == world.tenant_b

    # The console form decides the same way: another tenant's person is invited, never pulled in.
    Invitation.objects.all().delete()
    client.force_login(world.alice)
    assert client.post("/tenants/acme/members/", {"username": "bob", "role": "admin"}).status_code == 302
    assert Invitation.objects.get(user=world.bob).status == InvitationStatus.PENDING
    assert not Membership.objects.filter(user=world.bob, tenant=world.tenant_a).exists()
    assert client.post("/tenants/acme/members/", {"username": "vera", "role": "viewer"}).status_code == 302
    assert Membership.objects.get(user=world.vera, tenant=world.tenant_a).role == TenantRole.VIEWER


def test_members_write_does_not_tell_which_usernames_exist(world, api):
    """To a tenant admin, an unknown username and another tenant's user answer the same (11.2)."""
    alice = api(world.alice)

    def add(username):
        reply = alice.post(
            "/api/v1/tenants/acme/members/", {"username": username, "role": "viewer"}, format="json"
        )
        return reply.status_code, json.dumps(reply.json()["error"]).replace(username, "<name>")

    assert add("bob") == add("nobody-here")
    assert add("bob")[0] == 403
    # a platform admin is told (they may list every user anyway)
    root = api(world.admin)
    assert (
        root.post(
            "/api/v1/tenants/acme/members/", {"username": "nobody-here", "role": "viewer"}, format="json"
        ).status_code
        == 404
    )


def test_a_tenant_admin_withdraws_a_pending_invitation(world, api, client):
    invitation = _invite(api(world.alice)).json()
    path = f"/api/v1/tenants/acme/invitations/{invitation['id']}/"
    assert api(world.bob).delete(path).status_code == 404  # another tenant's admin
    assert api(world.dave).delete(path).status_code == 403  # a member who does not manage members
    assert api(world.alice).delete(path).status_code == 204
    assert Invitation.objects.get().status == InvitationStatus.WITHDRAWN
    assert AuditEvent.objects.filter(action="invitation.withdrawn").count() == 1
    refused = _session(api, world.bob).post(f"/api/v1/invitations/{invitation['id']}/accept/")
    assert refused.status_code == 409
    assert not Membership.objects.filter(user=world.bob, tenant=world.tenant_a).exists()

    again = _invite(api(world.alice)).json()  # the console's withdraw button does the same
    client.force_login(world.alice)
    assert client.post(f"/tenants/acme/invitations/{again['id']}/withdraw/").status_code == 302
    assert Invitation.objects.get(pk=again["id"]).status == InvitationStatus.WITHDRAWN


def test_an_invitation_from_someone_who_may_no_longer_add_members_is_void(world, api):
    """An admin demoted (or removed) after inviting cannot leave an admin invitation behind."""
    invitation = _invite(api(world.alice), role="admin").json()
    Membership.objects.filter(user=world.alice, tenant=world.tenant_a).update(role=TenantRole.VIEWER)
    refused = _session(api, world.bob).post(f"/api/v1/invitations/{invitation['id']}/accept/")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "invitation_void"
    assert not Membership.objects.filter(user=world.bob, tenant=world.tenant_a).exists()


def test_accepting_an_expired_invitation_writes_nothing(world, api):
    invitation = _invite(api(world.alice)).json()
    Invitation.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    events = AuditEvent.objects.count()
    refused = _session(api, world.bob).post(f"/api/v1/invitations/{invitation['id']}/accept/")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "invitation_expired"
    assert Invitation.objects.get().status == InvitationStatus.PENDING  # the periodic task expires it
    assert AuditEvent.objects.count() == events
