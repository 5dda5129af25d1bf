"""An operation whose worker dies is not left running forever: its worker renews a lease while the
handler runs, and the reaper fails the operations whose lease ran out, saying why."""

import time
from datetime import UTC, datetime, timedelta

import pytest

from core.models import Operation
from core.services import operations
from core.services.operations import HANDLERS, operation_run, operations_reap

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _operation(status: str, lease_until: datetime | None) -> Operation:
    return Operation.objects.create(
        kind="test.kind", status=status, lease_until=lease_until, created_by_name="t"
    )


@pytest.mark.django_db
def test_the_reaper_fails_only_running_operations_whose_lease_ran_out():
    dead = _operation("running", T0)
    alive = _operation("running", T0 + timedelta(seconds=30))
    done = _operation("succeeded", T0 - timedelta(hours=1))
    waiting = _operation("pending", None)
    assert operations_reap(T0 - timedelta(seconds=1)) == 0
    assert operations_reap(T0 + timedelta(seconds=1)) == 1
    dead.refresh_from_db()
    assert dead.status == "failed" and "worker stopped while running it" in dead.error
    assert dead.finished_at == T0 + timedelta(seconds=1)
    for other, status in ((alive, "running"), (done, "succeeded"), (waiting, "pending")):
        other.refresh_from_db()
        assert other.status == status


@pytest.mark.django_db(transaction=True)
def test_a_running_handler_keeps_its_lease_and_one_reaped_meanwhile_stays_failed(monkeypatch):
    monkeypatch.setattr(operations, "OPERATION_LEASE_SECONDS", 0.6)  # renewed every 0.2 s
    seen: list[datetime | None] = []

    def slow(operation: Operation) -> dict[str, str]:
        for _ in range(2):
            seen.append(Operation.objects.get(pk=operation.pk).lease_until)
            time.sleep(0.5)
        return {"ok": "yes"}

    def reaped(operation: Operation) -> dict[str, str]:
        operations_reap(datetime.now(UTC) + timedelta(seconds=5))  # as if its worker had been silent
        return {"ok": "too late"}

    monkeypatch.setitem(HANDLERS, "test.slow", slow)
    monkeypatch.setitem(HANDLERS, "test.reaped", reaped)
    first = Operation.objects.create(kind="test.slow", created_by_name="t")
    operation_run(str(first.pk))
    first.refresh_from_db()
    assert first.status == "succeeded" and seen[1] > seen[0]  # type: ignore[operator]
    second = Operation.objects.create(kind="test.reaped", created_by_name="t")
    operation_run(str(second.pk))  # finishing after the reaper failed it does not raise
    second.refresh_from_db()
    assert second.status == "failed" and second.result is None
