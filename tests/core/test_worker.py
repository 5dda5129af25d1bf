"""Long-running actions through a real Celery worker process and the configured broker."""

import pytest

from core.models import AuditEvent, Operation
from tests.support.processes import wait_for

pytestmark = pytest.mark.slow


def test_audit_verification_runs_in_the_worker_and_carries_the_request_id(world, api, celery_worker):
    client = api(world.auditor)
    response = client.post("/api/v1/audit-events/verify/", HTTP_X_REQUEST_ID="verify-req-1")
    assert response.status_code == 202
    location = response["Location"]
    assert location.endswith(f"/api/v1/operations/{response.json()['id']}/")

    def finished():
        body = client.get(location).json()
        return body if body["status"] in {"succeeded", "failed"} else None

    body = wait_for(finished, timeout=60)
    assert body["status"] == "succeeded", body
    assert body["result"]["ok"] is True and body["result"]["checked"] >= 1
    event = AuditEvent.objects.get(action="audit.chain_verified")
    assert event.request_id == "verify-req-1" and event.source == "task"
    assert event.actor_type == "system" and "audrey" in event.message


def test_redelivered_operation_runs_once(world, api, celery_worker):
    from core.tasks import run_operation

    operation_id = api(world.auditor).post("/api/v1/audit-events/verify/").json()["id"]
    wait_for(lambda: Operation.objects.get(pk=operation_id).status == "succeeded", timeout=60)
    run_operation.delay(operation_id)  # a duplicate delivery, as after a worker crash
    marker = api(world.auditor).post("/api/v1/audit-events/verify/").json()["id"]
    wait_for(lambda: Operation.objects.get(pk=marker).status == "succeeded", timeout=60)
    assert AuditEvent.objects.filter(action="audit.chain_verified", target_id=operation_id).count() == 1
