"""The audit chain: one event per change, tamper evidence, append-only storage, parallel writers."""

import threading
from itertools import pairwise

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from controlplane.models import AuditChainHead, AuditEvent
from controlplane.services.audit import audit_record, verify_chain
from tests.conftest import system

needs_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="append-only trigger and row locks are PostgreSQL features"
)


def write_events(count: int, tenant=None) -> None:
    for n in range(count):
        with transaction.atomic():
            audit_record(actor=system(), action="test.event", tenant=tenant, after={"n": n, "price": 1.5})


def tamper(sql: str, params: list) -> None:
    """What an attacker with raw database access does: bypass the append-only trigger and edit a row."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # flush deferred FK checks so ALTER may run
            cursor.execute(
                "ALTER TABLE controlplane_auditevent DISABLE TRIGGER controlplane_audit_append_only"
            )
        cursor.execute(sql, params)
        if connection.vendor == "postgresql":
            cursor.execute(
                "ALTER TABLE controlplane_auditevent ENABLE TRIGGER controlplane_audit_append_only"
            )


def test_chain_links_every_event(db):
    write_events(5)
    report = verify_chain()
    assert report.ok and report.checked == 5 and report.head_seq == 5
    events = list(AuditEvent.objects.order_by("seq"))
    assert events[0].prev_hash == "0" * 64
    assert all(later.prev_hash == earlier.hash for earlier, later in pairwise(events))


def test_edited_event_is_reported_as_first_broken_link(db):
    write_events(5)
    tamper("UPDATE controlplane_auditevent SET message = %s WHERE seq = %s", ["nothing to see", 3])
    report = verify_chain()
    assert not report.ok and report.first_broken_seq == 3 and "altered" in report.reason


def test_deleted_event_breaks_the_chain(db):
    write_events(5)
    tamper("DELETE FROM controlplane_auditevent WHERE seq = %s", [2])
    report = verify_chain()
    assert not report.ok and report.first_broken_seq == 2


def test_truncated_tail_is_detected_through_the_head(db):
    write_events(4)
    tamper("DELETE FROM controlplane_auditevent WHERE seq = %s", [4])
    report = verify_chain()
    assert not report.ok and report.first_broken_seq == 4 and "removed" in report.reason


def test_verify_command_exits_non_zero_on_a_broken_chain(db, capsys):
    write_events(3)
    call_command("verify_audit")
    assert '"ok": true' in capsys.readouterr().out
    tamper("UPDATE controlplane_auditevent SET actor_name = %s WHERE seq = %s", ["someone else", 1])
    with pytest.raises(CommandError, match="#1"):
        call_command("verify_audit")


@needs_postgres
def test_postgres_rejects_update_and_delete_of_audit_events(db):
    write_events(1)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.update(message="rewritten")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.all().delete()
    assert AuditEvent.objects.get().message == ""


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_parallel_writers_do_not_fork_the_chain():
    writers, per_writer = 8, 15
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            barrier.wait()
            write_events(per_writer)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    report = verify_chain()
    assert report.ok and report.checked == writers * per_writer
    assert AuditChainHead.objects.get().seq == writers * per_writer


def test_audit_api_filters_and_export(world, api):
    write_events(3, tenant=world.tenant_a)
    client = api(world.auditor)
    page = client.get("/api/v1/audit-events/?action=test.event&tenant=acme").json()
    assert page["count"] == 3
    first = page["results"][-1]
    assert set(first) >= {"seq", "occurred_at", "actor_name", "action", "target", "before", "after", "hash"}
    since = client.get(f"/api/v1/audit-events/?since={first['occurred_at']}&action=test.event").json()
    assert since["count"] == 3
    assert client.get("/api/v1/audit-events/?until=2000-01-01T00:00:00Z").json()["count"] == 0
    export = client.get("/api/v1/audit-events/export/?action=test.event")
    lines = b"".join(export.streaming_content).decode().splitlines()
    assert export["Content-Type"] == "application/jsonl" and len(lines) == 3
    assert '"n": 0' in lines[0]  # oldest first


def test_audit_records_request_id_of_the_api_call(world, api):
    client = api(world.admin)
    client.post(
        "/api/v1/tenants/",
        {"slug": "ri", "name": "RI", "residency": ["EU"]},
        format="json",
        HTTP_X_REQUEST_ID="req-12345",
    )
    assert AuditEvent.objects.get(action="tenant.created", tenant_slug="ri").request_id == "req-12345"


def test_one_event_per_change_even_across_services(world, api):
    client = api(world.alice)
    before = AuditEvent.objects.count()
    client.post("/api/v1/tenants/acme/members/", {"username": "vera", "role": "developer"}, format="json")
    client.post(
        "/api/v1/service-accounts/", {"name": "deploy", "tenant": "acme", "role": "developer"}, format="json"
    )
    assert AuditEvent.objects.count() == before + 2
