"""A budget alert fires once: its row and its audit event commit together or not at all, the webhook goes
out only once they have committed, and two evaluators at once never fire the same threshold twice.

No engines: the spend is a capacity segment and a price written directly. The evaluator is handed ``now``;
the Celery task reads the clock, so it runs with the clock set by time-machine.
"""

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
import time_machine
from django.db import connections, transaction

from billing import hooks, services, tasks
from billing.models import BudgetAlert, CapacitySegment, GpuPrice
from billing.services import evaluate_budgets
from core.models import AuditEvent, Tenant
from regions.services.deployments import deployment_create
from routing.selectors import current
from tests.support.principals import World, principal
from tests.support.regions import tiny_version

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: the behaviour is about them

START = datetime(2025, 6, 10, tzinfo=UTC)
NOW = START + timedelta(hours=5)
ACTION = "billing.budget_threshold"


class Webhook:
    """A local HTTP endpoint for budget webhooks. On each POST it reads the database from its own thread
    (its own connection, so only what has committed) and keeps the payload with what it saw."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                alert = BudgetAlert.objects.filter(threshold=payload["threshold"]).first()
                payload["committed"] = alert is not None and (
                    AuditEvent.objects.filter(action=ACTION, target_id=str(alert.pk)).exists()
                )
                connections.close_all()  # this thread's connection
                hook.received.append(payload)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/budget"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def thresholds(self) -> list[int]:
        return sorted(payload["threshold"] for payload in self.received)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.server.shutdown()


@pytest.fixture
def budgeted(world: World, make_region, tiny_model_dir, webhook: Webhook) -> Tenant:  # type: ignore[no-untyped-def]
    """Tenant A has spent exactly its 40.00 budget in June 2025 (4 GPU-hours at 10.00), under a hard limit."""
    region = make_region("eu-west-1", "EU")
    version = tiny_version(principal(world.operator), tiny_model_dir)
    chat = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    CapacitySegment.objects.create(
        deployment=chat,
        version=chat.version,
        region=region,
        gpu_type="L4",
        gpus=1,
        started_at=START,
        ended_at=START + timedelta(hours=4),
    )
    GpuPrice.objects.create(
        region=region, gpu_type="L4", hourly_price=Decimal("10.00"), effective_from=START - timedelta(days=1)
    )
    tenant = world.tenant_a
    tenant.monthly_budget, tenant.budget_hard_limit = Decimal("40.00"), True
    tenant.budget_webhook = webhook.url
    tenant.save()
    return tenant


def committed(tenant: Tenant) -> tuple[list[int], list[int]]:
    """The thresholds of the tenant's committed alerts, and of the alerts its committed audit events are
    about (-1: an event whose alert is not there)."""
    alerts = dict(BudgetAlert.objects.filter(tenant=tenant).values_list("pk", "threshold"))
    events = AuditEvent.objects.filter(action=ACTION, tenant=tenant).values_list("target_id", flat=True)
    return sorted(alerts.values()), sorted(alerts.get(int(target), -1) for target in events)


def test_an_alert_and_its_audit_event_commit_together_or_not_at_all(budgeted, webhook, monkeypatch):  # type: ignore[no-untyped-def]
    real = services.audit_record

    def audit_failing_at_80(**fields: Any) -> AuditEvent:
        if fields["target"].threshold == 80:
            raise RuntimeError("the audit chain is unavailable")
        return real(**fields)

    monkeypatch.setattr(services, "audit_record", audit_failing_at_80)
    with pytest.raises(RuntimeError):
        evaluate_budgets(now=NOW)
    assert committed(budgeted) == ([50], [50])  # the 80 % alert went with its audit event, not without it
    assert webhook.thresholds() == [50]  # and nothing was posted for it

    monkeypatch.setattr(services, "audit_record", real)
    assert sorted(a.threshold for a in evaluate_budgets(now=NOW)) == [80, 100]  # the next pass fires it
    assert committed(budgeted) == ([50, 80, 100], [50, 80, 100])
    assert webhook.thresholds() == [50, 80, 100]


def test_the_webhook_goes_out_only_once_the_alert_and_its_event_have_committed(budgeted, webhook):  # type: ignore[no-untyped-def]
    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), transaction.atomic():  # a caller's transaction that rolls back
        assert len(evaluate_budgets(now=NOW)) == 3
        raise Abandon
    assert webhook.received == [] and committed(budgeted) == ([], [])

    assert len(evaluate_budgets(now=NOW)) == 3
    assert webhook.thresholds() == [50, 80, 100]
    # Each POST found its alert and audit event already committed, read from the webhook's own connection.
    assert all(payload["committed"] for payload in webhook.received)


def test_two_evaluators_at_once_fire_each_threshold_once(budgeted, webhook, monkeypatch):  # type: ignore[no-untyped-def]
    real, inserted, release = services.audit_record, threading.Event(), threading.Event()

    def audit_held_open(**fields: Any) -> AuditEvent:
        if not inserted.is_set():  # the first evaluator stops inside its first alert's transaction
            inserted.set()
            release.wait(15)
        return real(**fields)

    monkeypatch.setattr(services, "audit_record", audit_held_open)
    fired: list[BudgetAlert] = []
    first = _evaluator(fired)
    first.start()
    assert inserted.wait(15)
    # The 50 % alert is inserted, its transaction still open: nobody else sees the alert without its event.
    assert committed(budgeted) == ([], [])
    second = _evaluator(fired)
    second.start()
    time.sleep(0.5)  # let the second evaluator reach the alert the first one holds, and wait on it
    release.set()
    first.join(15)
    second.join(15)
    assert not first.is_alive() and not second.is_alive()
    assert sorted(a.threshold for a in fired) == [50, 80, 100]  # between the two of them, each once
    assert committed(budgeted) == ([50, 80, 100], [50, 80, 100])
    assert webhook.thresholds() == [50, 80, 100]


def _evaluator(fired: list[BudgetAlert]) -> threading.Thread:
    def run() -> None:
        try:
            fired.extend(evaluate_budgets(now=NOW))
        finally:
            connections.close_all()  # this thread's connection

    return threading.Thread(target=run, daemon=True)


def test_the_task_tells_the_budget_listeners_and_routing_blocks_the_tenant(budgeted, monkeypatch):  # type: ignore[no-untyped-def]
    heard: list[list[int]] = []
    listener: Callable[[list[BudgetAlert]], None] = lambda alerts: heard.append(  # noqa: E731
        sorted(a.threshold for a in alerts)
    )
    monkeypatch.setattr(hooks, "BUDGET_LISTENERS", [*hooks.BUDGET_LISTENERS, listener])
    with time_machine.travel(NOW, tick=False):  # the task reads the clock
        assert tasks.evaluate_budgets() == 3
        table = current()
        assert table is not None and "monthly budget" in table.body["tenants"][budgeted.slug]["blocked"]
        assert tasks.evaluate_budgets() == 0  # nothing fired: no listener is told
    assert heard == [[50, 80, 100]]
