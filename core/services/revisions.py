"""Edits of objects that carry a ``revision`` (their API ETag): compare-and-set, validated, audited."""

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.db import models, transaction
from django.db.models import F
from django.utils import timezone

from core.errors import PreconditionFailed, ValidationFailed
from core.models import Tenant
from core.principal import Principal
from core.services.audit import audit_record, snapshot

M = TypeVar("M", bound=models.Model)


def reject_unknown(changes: Iterable[str], allowed: Iterable[str], message: str) -> None:
    unknown = set(changes) - set(allowed)
    if unknown:
        raise ValidationFailed(
            f"{message}: {', '.join(sorted(unknown))}.", detail={name: ["Unknown."] for name in unknown}
        )


def revised_update(
    *,
    actor: Principal,
    instance: M,
    changes: dict[str, Any],
    expected_revision: int | None,
    fields: Iterable[str],
    check: Callable[[M], None],
    action: str,
    tenant_of: Callable[[M], Tenant | None],
) -> M:
    """Apply ``changes`` under a row lock; a stale ``expected_revision`` (from If-Match) is 412."""
    manager = type(instance)._default_manager
    with transaction.atomic():
        current = manager.select_for_update().get(pk=instance.pk)
        revision = current.revision  # type: ignore[attr-defined]
        if expected_revision is not None and revision != expected_revision:
            raise PreconditionFailed(
                f"This {current._meta.verbose_name} changed since you read it "
                f"(revision {revision}, you sent {expected_revision}).",
                detail={"current_revision": revision},
            )
        before = snapshot(current, fields)
        for name, value in changes.items():
            setattr(current, name, value)
        check(current)
        manager.filter(pk=current.pk).update(**changes, revision=F("revision") + 1, updated_at=timezone.now())
        current.refresh_from_db()
        audit_record(
            actor=actor,
            action=action,
            target=current,
            tenant=tenant_of(current),
            before=before,
            after=snapshot(current, fields),
        )
    return current
