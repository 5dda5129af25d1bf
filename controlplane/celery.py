"""The Celery app, with request-id propagation and task metrics.

The request id active when a task is enqueued travels as a message header and is restored in the
worker, so logs and audit events written by the task carry the id of the request that caused it.
"""

import os
from typing import Any

from celery import Celery
from celery.signals import before_task_publish, task_failure, task_postrun, task_prerun, task_success

from core.observability import TASKS, current_request_id, request_id_var

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

_TOKENS: dict[str, Any] = {}


@before_task_publish.connect
def _attach_request_id(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is not None and current_request_id():
        headers.setdefault("request_id", current_request_id())


@task_prerun.connect
def _restore_request_id(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    rid = getattr(task.request, "request_id", None) if task is not None else None
    if task_id:
        _TOKENS[task_id] = request_id_var.set(rid or "")


@task_postrun.connect
def _clear_request_id(task_id: str | None = None, **_: Any) -> None:
    token = _TOKENS.pop(task_id or "", None)
    if token is not None:
        request_id_var.reset(token)


@task_success.connect
def _count_success(sender: Any = None, **_: Any) -> None:
    TASKS.labels(getattr(sender, "name", "unknown"), "succeeded").inc()


@task_failure.connect
def _count_failure(sender: Any = None, **_: Any) -> None:
    TASKS.labels(getattr(sender, "name", "unknown"), "failed").inc()
