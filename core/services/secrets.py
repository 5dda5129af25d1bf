"""Tenants' secrets: stored sealed (core/sealing.py), referred to by name (a pipeline's ``http`` stage
names the calling tenant's secret it sends), their values never shown or logged again: reads and the
audit trail give the name and the revision only. The gateways get the values of the secrets their route
table refers to, in their own copy of it (routing.selectors.for_gateways)."""

import re
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from core.choices import Scope
from core.errors import ValidationFailed
from core.models import Tenant, TenantSecret
from core.principal import Principal
from core.sealing import Unreadable, seal, unseal
from core.services.audit import audit_record, create_audited
from core.services.validation import full_clean

# Sent as ``Authorization: Bearer <value>``: visible ASCII, no spaces or line breaks (nothing that could
# end the header and start another).
VALUE = re.compile(r"^[\x21-\x7e]{1,4096}$")


def _context(owner: Tenant, name: str) -> str:
    return f"tenant-secret:{owner.pk}:{name}"


def secret_put(
    *, actor: Principal, owner: Tenant, name: str, value: str, now: datetime | None = None
) -> tuple[TenantSecret, bool]:
    """Store the secret, or replace its value (a new revision); whether it was created."""
    actor.require(Scope.SECRETS_WRITE, owner.pk)
    if not isinstance(value, str) or not VALUE.match(value):
        raise ValidationFailed(
            "A secret's value is 1 to 4,096 visible ASCII characters (no spaces or line breaks).",
            detail={"value": ["Invalid."]},
        )
    now = now or timezone.now()
    sealed = seal(value, _context(owner, name))
    with transaction.atomic():
        held = TenantSecret.objects.select_for_update().filter(owner=owner, name=name).first()
        if held is None:
            secret = TenantSecret(
                owner=owner,
                name=name,
                sealed=sealed,
                updated_by_name=actor.name,
                created_at=now,
                updated_at=now,
            )
            full_clean(secret, exclude=["owner", "sealed"])
            created = create_audited(
                actor=actor,
                instance=secret,
                action="secret.created",
                tenant=owner,
                after={"name": name, "revision": 1},
                taken=f"Secret {owner.slug}/{name} was just created: send it again to replace it.",
            )
            return created, True
        held.sealed, held.revision = sealed, held.revision + 1
        held.updated_by_name, held.updated_at = actor.name, now
        held.save(update_fields=["sealed", "revision", "updated_by_name", "updated_at"])
        audit_record(
            actor=actor,
            action="secret.rotated",
            target=held,
            tenant=owner,
            after={"name": name, "revision": held.revision},
        )
        return held, False


def secret_delete(*, actor: Principal, secret: TenantSecret) -> None:
    actor.require(Scope.SECRETS_WRITE, secret.owner_id)
    with transaction.atomic():
        audit_record(
            actor=actor,
            action="secret.deleted",
            target=secret,
            tenant=secret.owner,
            before={"name": secret.name, "revision": secret.revision},
        )
        secret.delete()


def secret_revisions() -> dict[tuple[int, str], int]:
    """(tenant id, name) → revision of every tenant's secrets (system use: no caller; no values)."""
    rows = TenantSecret.objects.values_list("owner_id", "name", "revision")
    return {(owner, name): revision for owner, name, revision in rows}


def secret_value(tenant: str, name: str) -> str | None:
    """The value of a tenant's (by slug) secret, for the gateways only; None when it is gone or no longer
    opens (the sealing key changed): the gateway then fails the stage that needs it, never calls
    without it."""
    secret = TenantSecret.objects.filter(owner__slug=tenant, name=name).select_related("owner").first()
    if secret is None:
        return None
    try:
        return unseal(bytes(secret.sealed), _context(secret.owner, name))
    except Unreadable:
        return None
