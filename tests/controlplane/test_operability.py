"""Health, readiness, metrics, request ids and structured logs."""

import json
import logging

from core.observability import JsonFormatter, RequestIdFilter, request_id_var


def test_healthz_is_always_ok(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_checks_database_and_broker(client, db):
    body = client.get("/readyz").json()
    assert body == {"status": "ready", "checks": {"database": "ok", "broker": "ok"}}


def test_readyz_fails_when_the_broker_is_unreachable(client, db, monkeypatch):
    from kombu import Connection

    from controlplane import health

    # A real connection attempt to a port where no broker listens.
    monkeypatch.setattr(
        health.celery_app, "connection_for_write", lambda: Connection("redis://127.0.0.1:1/0")
    )
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["broker"].startswith("unreachable")


def test_metrics_expose_request_counts_by_route(client, db):
    client.get("/healthz")
    text = client.get("/metrics").content.decode()
    assert 'controlplane_http_requests_total{method="GET",route="healthz",status="200"}' in text
    assert "controlplane_http_request_duration_seconds_bucket" in text
    assert "controlplane_tasks_total" in text


def test_request_id_is_echoed_or_generated(client, db):
    assert client.get("/healthz", HTTP_X_REQUEST_ID="abc-123")["X-Request-ID"] == "abc-123"
    generated = client.get("/healthz", HTTP_X_REQUEST_ID="bad id with spaces")["X-Request-ID"]
    assert generated != "bad id with spaces" and len(generated) == 32


def test_logs_are_json_with_the_request_id():
    record = logging.LogRecord("controlplane", logging.INFO, __file__, 1, "deployed %s", ("x",), None)
    token = request_id_var.set("rid-9")
    try:
        RequestIdFilter().filter(record)
    finally:
        request_id_var.reset(token)
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "deployed x" and entry["request_id"] == "rid-9" and entry["level"] == "INFO"
