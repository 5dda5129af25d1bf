"""Celery entry points of the platform core: take ids, call one service, return.

The Celery names stay ``controlplane.tasks.*``, as they were before the core app left the project package:
a name is what a queued message carries, so messages in the broker across an upgrade still find their task.
"""

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from core.models import IdempotencyRecord
from core.services.audit_checkpoints import checkpoint_head
from core.services.operations import operation_dispatcher, operation_run, operations_reap
from core.services.tenants import invitations_expire


@shared_task(name="controlplane.tasks.run_operation")
def run_operation(operation_id: str) -> None:
    operation_run(operation_id)


@operation_dispatcher
def _enqueue_operation(operation_id: str) -> None:
    run_operation.delay(operation_id)


@shared_task(name="controlplane.tasks.reap_operations")
def reap_operations() -> int:
    """Fail the running operations whose worker died (their lease ran out)."""
    return operations_reap(timezone.now())


@shared_task(name="controlplane.tasks.prune_idempotency_records")
def prune_idempotency_records() -> int:
    cutoff = timezone.now() - timedelta(hours=settings.IDEMPOTENCY_TTL_HOURS)
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted


@shared_task(name="controlplane.tasks.checkpoint_audit_chain")
def checkpoint_audit_chain() -> int | None:
    """Anchor the audit chain head outside the database (docs/audit.md); the seq checkpointed, if any."""
    checkpoint = checkpoint_head(now=timezone.now())
    return checkpoint.seq if checkpoint else None


@shared_task(name="controlplane.tasks.expire_invitations")
def expire_invitations() -> int:
    return invitations_expire(now=timezone.now())
