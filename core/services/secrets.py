"""Tenants' secrets: stored sealed (core/sealing.py), referred to by name (a pipeline's ``http`` stage
names the calling tenant's secret it sends), their values never shown or logged again: reads and the
audit trail give the name and the revision only. The gateways get the values of the secrets their route
table refers to, in their own copy of it (routing.selectors.for_gateways)."""

import logging
import re
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from core.choices import Scope
from core.errors import NotFound, PreconditionFailed, ValidationFailed
from core.models import Tenant, TenantSecret
from core.principal import Principal
from core.sealing import Unreadable, seal, unseal, unseal_with
from core.services.audit import audit_record, create_audited
from core.services.validation import full_clean

log = logging.getLogger(__name__)

# Sent as ``Authorization: Bearer <value>``: visible ASCII, no spaces or line breaks (nothing that could
# end the header and start another).
VALUE = re.compile(r"[\x21-\x7e]{1,4096}")


def _context(owner: Tenant, name: str) -> str:
    return f"tenant-secret:{owner.pk}:{name}"


def secret_put(
    *,
    actor: Principal,
    owner: Tenant,
    name: str,
    value: str,
    expected_revision: int | None = None,
    now: datetime | None = None,
) -> tuple[TenantSecret, bool]:
    """Store the secret, or replace its value (a new revision); whether it was created. With
    ``expected_revision``, only that revision is replaced (412 if it moved on)."""
    actor.require(Scope.SECRETS_WRITE, owner.pk)
    if not isinstance(value, str) or not VALUE.fullmatch(value):
        raise ValidationFailed(
            "A secret's value is 1 to 4,096 visible ASCII characters (no spaces or line breaks).",
            detail={"value": ["Invalid."]},
        )
    now = now or timezone.now()
    sealed = seal(value, _context(owner, name))
    with transaction.atomic():
        # The tenant's row, locked: two first PUTs of one name follow each other (the second a new
        # revision, as a repeated PUT is), never a conflict.
        Tenant.objects.select_for_update().filter(pk=owner.pk).first()
        held = TenantSecret.objects.filter(owner=owner, name=name).first()
        _check_revision(held, expected_revision, f"{owner.slug}/{name}")
        if held is None:
            return _created(actor, owner, name, sealed, now), True
        held.sealed, held.revision = sealed, held.revision + 1
        held.updated_by_name, held.updated_at = actor.name, now
        held.save(update_fields=["sealed", "revision", "updated_by_name", "updated_at"])
        after = {"name": name, "revision": held.revision}
        audit_record(actor=actor, action="secret.rotated", target=held, tenant=owner, after=after)
        return held, False


def _created(actor: Principal, owner: Tenant, name: str, sealed: bytes, now: datetime) -> TenantSecret:
    secret = TenantSecret(
        owner=owner, name=name, sealed=sealed, updated_by_name=actor.name, created_at=now, updated_at=now
    )
    full_clean(secret, exclude=["owner", "sealed"])
    return create_audited(
        actor=actor,
        instance=secret,
        action="secret.created",
        tenant=owner,
        after={"name": name, "revision": 1},
        taken=f"Secret {owner.slug}/{name} was just created: send it again to replace it.",
    )


def _check_revision(held: TenantSecret | None, expected: int | None, name: str) -> None:
    if expected is not None and (held is None or held.revision != expected):
        raise PreconditionFailed(f"Secret {name} changed since revision {expected}; read it again.")


def secret_delete(*, actor: Principal, secret: TenantSecret, expected_revision: int | None = None) -> None:
    actor.require(Scope.SECRETS_WRITE, secret.owner_id)
    with transaction.atomic():
        held = TenantSecret.objects.select_for_update().filter(pk=secret.pk).first()
        _check_revision(held, expected_revision, str(secret))
        deleted, _ = TenantSecret.objects.filter(pk=secret.pk).delete()
        if not deleted:  # deleted meanwhile by another request: one deletion, audited once
            raise NotFound(f"No secret '{secret}'.")
        before = {"name": secret.name, "revision": secret.revision}
        audit_record(actor=actor, action="secret.deleted", target=secret, tenant=secret.owner, before=before)


def secret_versions() -> dict[tuple[int, str], str]:
    """(tenant id, name) → a version of every tenant's secret that is never used twice (its row and its
    revision: a secret deleted and stored again is a new row), so a new value always makes a new route
    table (system use: no caller; no values)."""
    rows = TenantSecret.objects.values_list("owner_id", "name", "pk", "revision")
    return {(owner, name): f"{pk}.{revision}" for owner, name, pk, revision in rows}


def secrets_reseal(*, actor: Principal) -> dict[str, int]:
    """Seal every stored value that opens only under a fallback key again under the current one (after
    ``TENANT_SECRETS_KEY`` was rotated), each audited in its tenant's trail; the value and its revision
    stay as they were. Counts: resealed, current (nothing to do) and unreadable (under no key we hold:
    its tenant must store it again)."""
    counts = {"resealed": 0, "current": 0, "unreadable": 0, "gone": 0}
    for pk in TenantSecret.objects.order_by("pk").values_list("pk", flat=True):
        counts[_reseal(actor, pk)] += 1
    del counts["gone"]  # deleted while the pass ran: nothing to tell
    return counts


def _reseal(actor: Principal, pk: int) -> str:
    with transaction.atomic():  # one row at a time, locked: a tenant's PUT meanwhile is never overwritten
        secret = TenantSecret.objects.select_for_update().select_related("owner").filter(pk=pk).first()
        if secret is None:
            return "gone"
        context = _context(secret.owner, secret.name)
        try:
            value, current = unseal_with(bytes(secret.sealed), context)
        except Unreadable:
            return "unreadable"
        if current:
            return "current"
        secret.sealed = seal(value, context)
        secret.save(update_fields=["sealed"])
        after = {"name": secret.name, "revision": secret.revision}
        audit_record(actor=actor, action="secret.resealed", target=secret, tenant=secret.owner, after=after)
        return "resealed"


def secret_values(wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The values of the secrets ``wanted`` ((tenant slug, name) pairs), for the gateways only, in one
    read. One that is gone or no longer opens (the sealing key changed) is left out: the gateway then
    fails the stage that needs it, never calls without it."""
    owners = {slug for slug, _ in wanted}
    rows = TenantSecret.objects.filter(owner__slug__in=owners).select_related("owner")
    found = {}
    for secret in rows:
        key = (secret.owner.slug, secret.name)
        if key not in wanted:
            continue
        try:
            found[key] = unseal(bytes(secret.sealed), _context(secret.owner, secret.name))
        except Unreadable:
            log.error(
                "secret %s does not open: TENANT_SECRETS_KEY changed? Its tenant must store it again", secret
            )
    return found


def secret_value(tenant: str, name: str) -> str | None:
    return secret_values({(tenant, name)}).get((tenant, name))
