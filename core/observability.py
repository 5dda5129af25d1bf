"""Request ids, structured logs and Prometheus metrics.

A request id is taken from ``X-Request-ID`` (when it looks safe) or generated, returned on the
response, attached to every log line and audit event, and carried into the Celery tasks the request
enqueues (``controlplane.celery``), so one id follows an action from click to worker.
"""

import contextvars
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, resolve
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

HTTP_REQUESTS = Counter(
    "controlplane_http_requests_total", "HTTP requests served", ["method", "route", "status"]
)
HTTP_LATENCY = Histogram(
    "controlplane_http_request_duration_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TASKS = Counter("controlplane_tasks_total", "Celery tasks finished", ["task", "state"])


def new_request_id() -> str:
    return uuid.uuid4().hex


def current_request_id() -> str:
    return request_id_var.get()


def _route_of(path: str) -> str:
    # Label by URL pattern, not raw path, so ids in paths do not explode the metric's cardinality.
    try:
        match = resolve(path)
    except Resolver404:
        return "unmatched"
    return (match.route or match.view_name or "unknown").lstrip("^").rstrip("$")


class RequestContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-ID", "")
        rid = incoming if _SAFE_ID.match(incoming) else new_request_id()
        token = request_id_var.set(rid)
        start = time.perf_counter()
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        route = _route_of(request.path_info)
        HTTP_LATENCY.labels(request.method, route).observe(time.perf_counter() - start)
        HTTP_REQUESTS.labels(request.method, route, str(response.status_code)).inc()
        response["X-Request-ID"] = rid
        return response


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def metrics_exposition() -> bytes:
    """All processes' metrics when PROMETHEUS_MULTIPROC_DIR is set (gunicorn workers, Celery), else ours."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest()


METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
