"""Liveness, readiness and metrics endpoints for orchestrators and Prometheus."""

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from controlplane.celery import app as celery_app
from core.observability import METRICS_CONTENT_TYPE, metrics_exposition


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _database_ok() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return f"unreachable: {exc}"
    return "ok"


def _broker_ok() -> str:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        return f"unreachable: {exc}"
    return "ok"


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks = {"database": _database_ok(), "broker": _broker_ok()}
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ready" if ready else "unavailable", "checks": checks}, status=200 if ready else 503
    )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    return HttpResponse(metrics_exposition(), content_type=METRICS_CONTENT_TYPE)
