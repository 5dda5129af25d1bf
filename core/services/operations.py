"""Long-running actions: recorded as an Operation, run by a Celery worker, polled through the API."""

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from core.choices import OPERATION_TRANSITIONS, OperationStatus
from core.errors import InvalidTransition, NotFound
from core.models import Operation, Tenant
from core.observability import current_request_id
from core.principal import Principal

log = logging.getLogger(__name__)
OPERATION_LEASE_SECONDS = 60.0  # a running operation's worker renews every 20 s; 60 s silent: dead

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

    A redelivered message for an operation already claimed is a no-op. While the handler runs, a thread
    renews the operation's lease; a worker that dies stops renewing, and ``operations_reap`` fails it.
    """
    operation = Operation.objects.filter(pk=operation_id).first()
    if operation is None or operation.status != OperationStatus.PENDING:
        return
    now = timezone.now()
    try:
        operation_transition(operation, OperationStatus.RUNNING, started_at=now, lease_until=_lease(now))
    except InvalidTransition:
        return
    heartbeat = _Heartbeat(operation.pk)
    heartbeat.start()
    try:
        result = HANDLERS[operation.kind](operation)
    except Exception as exc:
        log.exception("operation %s (%s) failed", operation.pk, operation.kind)
        _finish(operation, OperationStatus.FAILED, error=str(exc)[:2000], finished_at=timezone.now())
        return
    finally:
        heartbeat.stop()
    _finish(operation, OperationStatus.SUCCEEDED, result=result, progress=100, finished_at=timezone.now())


def _finish(operation: Operation, to: str, **fields: Any) -> None:
    try:
        operation_transition(operation, to, **fields)
    except InvalidTransition:  # reaped meanwhile (its lease ran out): the record says failed, and stays so
        log.warning("operation %s finished (%s) after it was reaped", operation.pk, to)


def _lease(now: datetime) -> datetime:
    return now + timedelta(seconds=OPERATION_LEASE_SECONDS)


class _Heartbeat(threading.Thread):
    """Renews a running operation's lease every third of it until stopped."""

    def __init__(self, pk: Any):
        super().__init__(daemon=True, name=f"operation-{pk}")
        self.pk, self.done = pk, threading.Event()

    def run(self) -> None:
        try:
            while not self.done.wait(OPERATION_LEASE_SECONDS / 3):
                now = timezone.now()
                Operation.objects.filter(pk=self.pk, status=OperationStatus.RUNNING).update(
                    lease_until=_lease(now)
                )
        except Exception:  # a missed renewal is retried; the reaper waits a whole lease
            log.exception("could not renew the lease of operation %s", self.pk)
        finally:
            connection.close()  # this thread's own connection

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=5)


def operations_reap(now: datetime) -> int:
    """Fail every running operation whose worker stopped renewing its lease (it died, or lost the
    database for a whole lease); how many. Their handlers are not resumed: run them again."""
    reaped = 0
    for operation in Operation.objects.filter(status=OperationStatus.RUNNING, lease_until__lt=now):
        since = f"{operation.lease_until:%Y-%m-%d %H:%M:%S} UTC"
        message = f"Its worker stopped while running it (no heartbeat since {since}); start it again."
        try:
            operation_transition(operation, OperationStatus.FAILED, error=message, finished_at=now)
        except InvalidTransition:
            continue  # it finished meanwhile
        log.warning("operation %s (%s) reaped: %s", operation.pk, operation.kind, message)
        reaped += 1
    return reaped
