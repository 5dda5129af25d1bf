"""Tenants, their members and their service accounts."""

from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from controlplane.choices import PlatformRole, Scope, TenantRole
from controlplane.errors import Conflict, ValidationFailed
from controlplane.models import Membership, ServiceAccount, Tenant, User
from controlplane.principal import Principal
from controlplane.services.audit import audit_record, snapshot
from controlplane.services.revisions import reject_unknown, revised_update
from controlplane.services.validation import full_clean, jurisdiction_codes

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
    "budget_webhook",
    "requests_per_minute",
    "tokens_per_minute",
)
EDITABLE_TENANT_FIELDS = frozenset(TENANT_FIELDS) - {"slug"}


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


def membership_set(*, actor: Principal, tenant: Tenant, user: User, role: str) -> Membership:
    """Add a user to a tenant, or change their role there."""
    actor.require(Scope.MEMBERS_WRITE, tenant.pk)
    if role not in TenantRole.values:
        raise ValidationFailed(f"Unknown tenant role '{role}'; use {', '.join(TenantRole.values)}.")
    with transaction.atomic():
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
    *, actor: Principal, name: str, role: str, tenant: Tenant | None = None, description: str = ""
) -> ServiceAccount:
    """A robot of a tenant (with a tenant role) or of the platform (with a platform role)."""
    if tenant is not None:
        actor.require(Scope.MEMBERS_WRITE, tenant.pk)
        allowed = TenantRole.values
    else:
        actor.require(Scope.USERS_WRITE)
        allowed = [r for r in PlatformRole.values if r]
    if role not in allowed:
        raise ValidationFailed(f"Role '{role}' is not valid here; use {', '.join(allowed)}.")
    robot = ServiceAccount(name=name, tenant=tenant, role=role, description=description)
    full_clean(robot)
    try:
        with transaction.atomic():
            robot.save()
            audit_record(
                actor=actor,
                action="service_account.created",
                target=robot,
                tenant=tenant,
                after=snapshot(robot, ("name", "role", "description")),
            )
    except IntegrityError as exc:
        raise Conflict(
            f"A service account named '{name}' already exists there.", code="already_exists"
        ) from exc
    return robot
