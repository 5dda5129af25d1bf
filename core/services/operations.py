"""Long-running actions: recorded as an Operation, run by a Celery worker, polled through the API."""

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.choices import OPERATION_TRANSITIONS, OperationStatus
from core.errors import InvalidTransition, NotFound
from core.models import Operation, Tenant
from core.observability import current_request_id
from core.principal import Principal

log = logging.getLogger(__name__)

# kind → handler(operation) → result. Capabilities register their long-running actions here.
HANDLERS: dict[str, Callable[[Operation], dict[str, Any]]] = {}

# How a recorded operation reaches a worker: core.tasks registers its Celery task here, because
# tasks import services and never the other way round (the app's ready() imports tasks).
DISPATCHERS: list[Callable[[str], None]] = []


def operation_handler(kind: str) -> Callable[[Callable[[Operation], dict[str, Any]]], Callable[..., Any]]:
    def register(func: Callable[[Operation], dict[str, Any]]) -> Callable[[Operation], dict[str, Any]]:
        HANDLERS[kind] = func
        return func

    return register


def operation_dispatcher(dispatch: Callable[[str], None]) -> Callable[[str], None]:
    if dispatch not in DISPATCHERS:
        DISPATCHERS.append(dispatch)
    return dispatch


def operation_start(
    *, actor: Principal, kind: str, params: dict[str, Any] | None = None, tenant: Tenant | None = None
) -> Operation:
    """Record the operation and enqueue it once the caller's transaction commits."""
    if kind not in HANDLERS:
        raise NotFound(f"No operation of kind '{kind}'.")
    if not DISPATCHERS:  # recorded but never run would leave it pending forever: refuse instead
        raise RuntimeError("no operation dispatcher is registered (core.tasks is not loaded)")
    operation = Operation.objects.create(
        kind=kind,
        params=params or {},
        tenant=tenant,
        created_by_name=actor.name,
        created_by_key=actor.key,
        request_id=current_request_id(),
    )
    transaction.on_commit(lambda: _dispatch(str(operation.pk)))
    return operation


def _dispatch(operation_id: str) -> None:
    for dispatch in DISPATCHERS:
        dispatch(operation_id)


def operation_transition(operation: Operation, to: str, **fields: Any) -> None:
    """Compare-and-set the status; a lost race raises InvalidTransition."""
    if to not in OPERATION_TRANSITIONS[operation.status]:
        raise InvalidTransition(f"Operation cannot go from {operation.status} to {to}.")
    updated = Operation.objects.filter(pk=operation.pk, status=operation.status).update(status=to, **fields)
    if not updated:
        raise InvalidTransition(f"Operation {operation.pk} was moved by someone else.")
    operation.status = to
    for name, value in fields.items():
        setattr(operation, name, value)


def operation_run(operation_id: str) -> None:
    """Claim a pending operation, run its handler, record the result.

    A redelivered message for an operation already claimed is a no-op.
    """
    operation = Operation.objects.filter(pk=operation_id).first()
    if operation is None or operation.status != OperationStatus.PENDING:
        return
    try:
        operation_transition(operation, OperationStatus.RUNNING, started_at=timezone.now())
    except InvalidTransition:
        return
    try:
        result = HANDLERS[operation.kind](operation)
    except Exception as exc:
        log.exception("operation %s (%s) failed", operation.pk, operation.kind)
        operation_transition(
            operation, OperationStatus.FAILED, error=str(exc)[:2000], finished_at=timezone.now()
        )
        return
    operation_transition(
        operation, OperationStatus.SUCCEEDED, result=result, progress=100, finished_at=timezone.now()
    )
