"""Tenants, their members and their service accounts."""

import re
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.choices import AuditSource, InvitationStatus, PlatformRole, Scope, TenantRole
from core.errors import Conflict, Forbidden, NotFound, ValidationFailed
from core.models import REGION_CODE, Invitation, Membership, ServiceAccount, Tenant, User
from core.principal import Principal
from core.services.audit import audit_record, snapshot
from core.services.revisions import reject_unknown, revised_update
from core.services.validation import full_clean, jurisdiction_codes

TENANT_FIELDS = (
    "slug",
    "name",
    "status",
    "home_region",
    "residency",
    "max_gpus",
    "monthly_budget",
    "budget_currency",
    "budget_thresholds",
    "budget_hard_limit",
    "budget_degrade_at",
    "budget_webhook",
    "requests_per_minute",
    "tokens_per_minute",
    "concurrent_requests",
)
EDITABLE_TENANT_FIELDS = frozenset(TENANT_FIELDS) - {"slug"}

REGION = re.compile(REGION_CODE)  # whether a region of that code exists is not core's to know


def tenant_create(*, actor: Principal, slug: str, name: str, residency: list[str], **fields: Any) -> Tenant:
    actor.require(Scope.TENANTS_WRITE)
    reject_unknown(fields, EDITABLE_TENANT_FIELDS, "Unknown tenant field(s)")
    fields.setdefault("budget_currency", settings.BILLING_CURRENCY)  # budgets are kept in the cost currency
    tenant = Tenant(slug=slug, name=name, residency=jurisdiction_codes(residency), **fields)
    full_clean(tenant)
    with transaction.atomic():
        if Tenant.objects.filter(slug=slug).exists():
            raise Conflict(f"A tenant with slug '{slug}' already exists.", code="already_exists")
        tenant.save()
        audit_record(
            actor=actor,
            action="tenant.created",
            target=tenant,
            tenant=tenant,
            after=snapshot(tenant, TENANT_FIELDS),
        )
    return tenant


def tenant_update(
    *, actor: Principal, tenant: Tenant, changes: dict[str, Any], expected_revision: int | None = None
) -> Tenant:
    """Change a tenant; ``expected_revision`` (from If-Match) makes it a compare-and-set."""
    actor.require(Scope.TENANTS_WRITE)
    reject_unknown(changes, EDITABLE_TENANT_FIELDS, "Field(s) that cannot be changed")
    if "residency" in changes:
        changes["residency"] = jurisdiction_codes(changes["residency"])
    return revised_update(
        actor=actor,
        instance=tenant,
        changes=changes,
        expected_revision=expected_revision,
        fields=TENANT_FIELDS,
        check=full_clean,
        action="tenant.updated",
        tenant_of=lambda t: t,
    )


def may_add_without_consent(actor: Principal) -> bool:
    """Who may put an existing user into a tenant without the user accepting an invitation: platform
    admins only. Tenant admins add the users they create for their tenant, or invite."""
    return actor.sees_all(Scope.MEMBERS_WRITE)


def _check_role(role: str) -> None:
    if role not in TenantRole.values:
        raise ValidationFailed(f"Unknown tenant role '{role}'; use {', '.join(TenantRole.values)}.")


def _needs_invitation(actor: Principal, tenant: Tenant, user: User) -> bool:
    """The membership rule: a non-member joins by accepting an invitation, unless a platform admin adds
    them."""
    exists = Membership.objects.filter(tenant=tenant, user=user).exists()
    return not exists and not may_add_without_consent(actor)


def membership_add_or_invite(
    *, actor: Principal, tenant: Tenant, user: User, role: str
) -> Membership | Invitation:
    """The console's "add member": set the role where that needs no consent, else send an invitation."""
    actor.require(Scope.MEMBERS_WRITE, tenant.pk)
    if _needs_invitation(actor, tenant, user):
        return invitation_create(actor=actor, tenant=tenant, user=user, role=role)
    return membership_set(actor=actor, tenant=tenant, user=user, role=role)


def _invitation_required(tenant: Tenant, username: str) -> Forbidden:
    return Forbidden(
        f"{username} is not a member of {tenant.slug}. A tenant admin cannot add an existing "
        f"user without their consent: invite them (POST /api/v1/tenants/{tenant.slug}/invitations/) "
        "and they join when they accept.",
        code="invitation_required",
    )


def membership_set_by_username(*, actor: Principal, tenant: Tenant, username: str, role: str) -> Membership:
    """membership_set for a username: to anyone but a platform admin an unknown username answers exactly
    as another tenant's user does (invitation_required), so the endpoint does not reveal who exists."""
    actor.require(Scope.MEMBERS_WRITE, tenant.pk)
    user = User.objects.filter(username=username, is_active=True).first()
    if user is None:
        if may_add_without_consent(actor):
            raise NotFound(f"No user '{username}'.")
        raise _invitation_required(tenant, username)
    return membership_set(actor=actor, tenant=tenant, user=user, role=role)


def membership_set(*, actor: Principal, tenant: Tenant, user: User, role: str) -> Membership:
    """Change a member's role; add a new member only as a platform admin (others invite)."""
    actor.require(Scope.MEMBERS_WRITE, tenant.pk)
    _check_role(role)
    with transaction.atomic():
        if _needs_invitation(actor, tenant, user):
            raise _invitation_required(tenant, user.username)
        return _membership_write(actor=actor, tenant=tenant, user=user, role=role)


def _membership_write(*, actor: Principal, tenant: Tenant, user: User, role: str) -> Membership:
    """Create or change the membership, audited; the caller checked who may, inside its transaction."""
    membership = Membership.objects.select_for_update().filter(tenant=tenant, user=user).first()
    before = {"role": membership.role} if membership else None
    if membership is None:
        membership = Membership.objects.create(tenant=tenant, user=user, role=role)
    else:
        Membership.objects.filter(pk=membership.pk).update(role=role)
        membership.role = role
    audit_record(
        actor=actor,
        action="membership.set",
        target=membership,
        tenant=tenant,
        before=before,
        after={"user": user.username, "role": role},
    )
    return membership


def tenant_user_create(*, actor: Principal, tenant: Tenant, user: User, role: str) -> Membership:
    """Make a user the tenant admin just created for this tenant a member (users.user_create calls it
    in its transaction): a user created for a tenant needs no invitation."""
    actor.require(Scope.MEMBERS_WRITE, tenant.pk)
    _check_role(role)
    return _membership_write(actor=actor, tenant=tenant, user=user, role=role)


def invitation_create(
    *, actor: Principal, tenant: Tenant, user: User, role: str, now: datetime | None = None
) -> Invitation:
    """Invite an existing user to join ``tenant`` with ``role``; expires after INVITATION_TTL_DAYS."""
    actor.require(Scope.MEMBERS_WRITE, tenant.pk)
    _check_role(role)
    now = now or timezone.now()
    try:
        return _invitation_insert(actor=actor, tenant=tenant, user=user, role=role, now=now)
    except IntegrityError as exc:  # a concurrent invitation of the same user won
        raise Conflict(f"{user.username} already has a pending invitation.", code="already_invited") from exc


def _invitation_insert(
    *, actor: Principal, tenant: Tenant, user: User, role: str, now: datetime
) -> Invitation:
    with transaction.atomic():
        if Membership.objects.filter(tenant=tenant, user=user).exists():
            raise Conflict(f"{user.username} is already a member of {tenant.slug}.", code="already_member")
        invitations_expire(now=now, tenant=tenant, user=user)
        if Invitation.objects.filter(tenant=tenant, user=user, status=InvitationStatus.PENDING).exists():
            raise Conflict(f"{user.username} already has a pending invitation.", code="already_invited")
        invitation = Invitation.objects.create(
            tenant=tenant,
            user=user,
            role=role,
            invited_by_name=actor.name,
            invited_by=actor.user,
            created_at=now,
            expires_at=now + timedelta(days=settings.INVITATION_TTL_DAYS),
        )
        audit_record(
            actor=actor,
            action="invitation.created",
            target=invitation,
            tenant=tenant,
            after={"user": user.username, "role": role, "expires_at": invitation.expires_at},
        )
    return invitation


def _invitation_move(
    *, actor: Principal, invitation: Invitation, to: str, now: datetime, extra: dict[str, Any] | None = None
) -> Invitation:
    """Compare-and-set pending → ``to``, audited in the caller's transaction."""
    moved = Invitation.objects.filter(pk=invitation.pk, status=InvitationStatus.PENDING).update(
        status=to, responded_at=now
    )
    if not moved:
        raise Conflict(f"This invitation is already {invitation.status}.", code="invalid_transition")
    invitation.status, invitation.responded_at = to, now
    audit_record(
        actor=actor,
        action=f"invitation.{to}",
        target=invitation,
        tenant=invitation.tenant,
        before={"status": InvitationStatus.PENDING},
        after={"status": to, "user": invitation.user.username, "role": invitation.role, **(extra or {})},
    )
    return invitation


def _check_invitee(actor: Principal, invitation: Invitation) -> None:
    """Only the invited person answers, and only from their console session: no token, however scoped or
    bound, can consent for them (an app's or CI's token of that user may be held by someone else)."""
    if actor.user is None or actor.user.pk != invitation.user_id:
        raise Forbidden("Only the invited user can answer an invitation.")
    if actor.token is not None:
        raise Forbidden(
            "An invitation is answered by the invited person signed in to the console, not with an API "
            "token.",
            code="session_required",
        )


def invitation_accept(*, actor: Principal, invitation: Invitation, now: datetime | None = None) -> Membership:
    """The invited user joins the tenant with the invited role (before it expires)."""
    _check_invitee(actor, invitation)
    now = now or timezone.now()
    if invitation.expires_at <= now:  # nothing written: the periodic task marks it expired
        raise Conflict("This invitation has expired; ask for a new one.", code="invitation_expired")
    if not _inviter_may_still_add(invitation):
        raise Conflict(
            f"Whoever invited you may no longer add members to {invitation.tenant.slug}; ask one of its "
            "admins for a new invitation.",
            code="invitation_void",
        )
    with transaction.atomic():
        _invitation_move(actor=actor, invitation=invitation, to=InvitationStatus.ACCEPTED, now=now)
        return _membership_write(
            actor=actor, tenant=invitation.tenant, user=invitation.user, role=invitation.role
        )


def _inviter_may_still_add(invitation: Invitation) -> bool:
    inviter = invitation.invited_by
    if inviter is None:  # a robot's or the system's invitation: it holds for its lifetime
        return True
    as_now = Principal.for_user(inviter, source=AuditSource.SYSTEM) if inviter.is_active else None
    return as_now is not None and as_now.may(Scope.MEMBERS_WRITE, invitation.tenant_id)


def invitation_withdraw(
    *, actor: Principal, invitation: Invitation, now: datetime | None = None
) -> Invitation:
    """A tenant's member manager takes back a pending invitation (e.g. one a departing admin left)."""
    actor.require(Scope.MEMBERS_WRITE, invitation.tenant_id)
    with transaction.atomic():
        return _invitation_move(
            actor=actor, invitation=invitation, to=InvitationStatus.WITHDRAWN, now=now or timezone.now()
        )


def invitation_decline(
    *, actor: Principal, invitation: Invitation, now: datetime | None = None
) -> Invitation:
    _check_invitee(actor, invitation)
    with transaction.atomic():
        return _invitation_move(
            actor=actor, invitation=invitation, to=InvitationStatus.DECLINED, now=now or timezone.now()
        )


def invitations_expire(*, now: datetime, tenant: Tenant | None = None, user: User | None = None) -> int:
    """Mark pending invitations past their expiry as expired (audited, by the system); returns how many."""
    due = Invitation.objects.filter(status=InvitationStatus.PENDING, expires_at__lte=now)
    if tenant is not None:
        due = due.filter(tenant=tenant)
    if user is not None:
        due = due.filter(user=user)
    system = Principal.system("invitation-expiry")
    count = 0
    with transaction.atomic():
        for invitation in due.select_related("tenant", "user"):
            try:
                _invitation_move(actor=system, invitation=invitation, to=InvitationStatus.EXPIRED, now=now)
            except Conflict:
                continue  # answered meanwhile
            count += 1
    return count


def membership_remove(*, actor: Principal, membership: Membership) -> None:
    actor.require(Scope.MEMBERS_WRITE, membership.tenant_id)
    with transaction.atomic():
        deleted, _ = Membership.objects.filter(pk=membership.pk).delete()
        if not deleted:
            raise Conflict("This membership was already removed.")
        audit_record(
            actor=actor,
            action="membership.removed",
            target=membership,
            tenant=membership.tenant,
            before={"user": membership.user.username, "role": membership.role},
        )


def service_account_create(
    *,
    actor: Principal,
    name: str,
    role: str,
    tenant: Tenant | None = None,
    description: str = "",
    regions: list[str] | None = None,
) -> ServiceAccount:
    """A robot of a tenant (with a tenant role) or of the platform (with a platform role; a gateway's
    may be bound to the ``regions`` its gateways serve)."""
    regions = regions or []
    if regions and (tenant is not None or len(regions) > 64 or not all(REGION.fullmatch(r) for r in regions)):
        raise ValidationFailed(
            "regions (a gateway's account: platform robots only) lists up to 64 region codes.",
            detail={"regions": ["Invalid."]},
        )
    if tenant is not None:
        actor.require(Scope.MEMBERS_WRITE, tenant.pk)
        allowed = TenantRole.values
    else:
        actor.require(Scope.USERS_WRITE)
        allowed = [r for r in PlatformRole.values if r]
    if role not in allowed:
        raise ValidationFailed(f"Role '{role}' is not valid here; use {', '.join(allowed)}.")
    robot = ServiceAccount(
        name=name, tenant=tenant, role=role, description=description, regions=sorted(set(regions))
    )
    full_clean(robot)
    try:
        with transaction.atomic():
            robot.save()
            audit_record(
                actor=actor,
                action="service_account.created",
                target=robot,
                tenant=tenant,
                after=snapshot(robot, ("name", "role", "description", "regions")),
            )
    except IntegrityError as exc:
        raise Conflict(
            f"A service account named '{name}' already exists there.", code="already_exists"
        ) from exc
    return robot
