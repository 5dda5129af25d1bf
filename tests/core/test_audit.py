"""The audit chain: one event per change, tamper evidence, append-only storage, parallel writers."""

import json
import stat
import threading
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from core.models import AuditChainHead, AuditEvent
from core.services import audit
from core.services.audit import audit_record, event_hash, verify_chain
from core.services.audit_checkpoints import LOG_NAME, checkpoint_head
from core.services.audit_verification import verify_audit
from core.services.operations import operation_run, operation_start
from core.tasks import checkpoint_audit_chain
from tests.support.principals import principal, system

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

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


def test_event_moved_to_another_tenant_breaks_the_chain(world):
    write_events(3, tenant=world.tenant_a)
    tamper("UPDATE controlplane_auditevent SET tenant_id = %s WHERE seq = %s", [world.tenant_b.pk, 2])
    report = verify_chain()
    assert not report.ok and report.first_broken_seq == 2


def test_the_current_hash_format_covers_every_column():
    columns = {field.attname for field in AuditEvent._meta.concrete_fields}
    assert columns == set(audit.HASHED_FIELDS[audit.HASH_VERSION]) | audit.UNHASHED_FIELDS
    assert {"tenant_id", "hash_version"} <= set(audit.HASHED_FIELDS[audit.HASH_VERSION])


def write_legacy_events(monkeypatch, count: int, tenant=None) -> None:
    """Events as written before migration 0005 (hash format 1, which does not cover tenant_id)."""
    with monkeypatch.context() as patch:
        patch.setattr(audit, "HASH_VERSION", 1)
        write_events(count, tenant=tenant)


def test_legacy_events_keep_verifying_and_a_legacy_tenant_move_is_caught(world, monkeypatch):
    write_legacy_events(monkeypatch, 2, tenant=world.tenant_a)
    write_events(2, tenant=world.tenant_a)
    assert [e.hash_version for e in AuditEvent.objects.order_by("seq")] == [1, 1, 2, 2]
    assert verify_chain().ok
    tamper("UPDATE controlplane_auditevent SET tenant_id = %s WHERE seq = %s", [world.tenant_b.pk, 1])
    report = verify_chain()
    assert not report.ok and report.first_broken_seq == 1 and "another tenant" in report.reason


def test_rewriting_an_event_in_the_older_format_is_caught(world):
    write_events(3, tenant=world.tenant_a)
    last = AuditEvent.objects.get(seq=3)
    last.tenant, last.tenant_slug, last.hash_version = world.tenant_b, world.tenant_b.slug, 1
    forged = event_hash(last)  # a consistent format-1 event, moved to the other tenant
    tamper(
        "UPDATE controlplane_auditevent SET tenant_id = %s, tenant_slug = %s, hash_version = 1, hash = %s "
        "WHERE seq = 3",
        [world.tenant_b.pk, world.tenant_b.slug, forged],
    )
    tamper("UPDATE controlplane_auditchainhead SET hash = %s WHERE id = 1", [forged])
    report = verify_chain()
    assert not report.ok and report.first_broken_seq == 3 and "format 1 after format 2" in report.reason


def test_deleting_the_newest_events_and_rewinding_the_head_is_detected_after_a_checkpoint(db):
    write_events(5)
    call_command("verify_audit")  # verified, and anchored outside the database
    third = AuditEvent.objects.get(seq=3)
    tamper("DELETE FROM controlplane_auditevent WHERE seq > %s", [3])
    tamper("UPDATE controlplane_auditchainhead SET seq = %s, hash = %s WHERE id = 1", [3, third.hash])
    with pytest.raises(CommandError, match="checkpoint"):
        call_command("verify_audit")


def checkpoint_lines(settings) -> list[dict]:
    path = Path(settings.AUDIT_CHECKPOINT_DIR) / LOG_NAME
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def rewind_to(seq: int) -> None:
    """Delete every event after ``seq`` and move the head row back, as the table's owner can."""
    kept = AuditEvent.objects.get(seq=seq)
    tamper("DELETE FROM controlplane_auditevent WHERE seq > %s", [seq])
    tamper("UPDATE controlplane_auditchainhead SET seq = %s, hash = %s WHERE id = 1", [seq, kept.hash])


def test_a_fresh_install_verifies_and_says_truncation_is_not_yet_detectable(db, settings):
    empty = verify_audit(now=T0)
    assert empty.ok and empty.checkpoint is None and "cannot be detected" in empty.warning
    assert checkpoint_lines(settings) == []  # nothing to anchor yet
    write_events(3)
    report = verify_audit(now=T0)
    assert report.ok and "no signed checkpoint yet" in report.warning
    assert report.checkpoint_written == {
        "seq": 3,
        "hash": AuditEvent.objects.get(seq=3).hash,
        "at": T0.isoformat(),
    }
    again = verify_audit(now=T0 + timedelta(hours=1))
    assert (
        again.ok and again.checkpoint["seq"] == 3 and again.warning == "" and again.checkpoint_written is None
    )


def test_events_after_the_newest_checkpoint_are_named_as_not_covered(db):
    write_events(2)
    checkpoint_head(now=T0)
    write_events(2)
    report = verify_audit(now=T0 + timedelta(minutes=5))
    assert report.ok and "after #2" in report.warning and report.checkpoint_written["seq"] == 4


def test_periodic_checkpoint_anchors_the_head_once(db, settings):
    assert checkpoint_head(now=T0) is None  # empty chain
    write_events(2)
    assert checkpoint_head(now=T0).seq == 2
    assert checkpoint_head(now=T0 + timedelta(minutes=5)) is None  # head unchanged
    write_events(1)
    assert checkpoint_audit_chain() == 3  # the beat task
    assert [line["seq"] for line in checkpoint_lines(settings)] == [2, 3]
    assert stat.S_IMODE(Path(settings.AUDIT_CHECKPOINT_KEY_FILE).stat().st_mode) == 0o600
    assert "controlplane.tasks.checkpoint_audit_chain" in {
        entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()
    }


def test_rewinding_the_head_behind_a_checkpoint_is_detected(db, settings):
    write_events(5)
    checkpoint_head(now=T0)
    rewind_to(3)
    assert verify_chain().ok  # the chain alone cannot tell
    report = verify_audit(now=T0 + timedelta(hours=1))
    assert not report.ok and report.first_broken_seq == 4 and "signed checkpoint" in report.reason
    assert len(checkpoint_lines(settings)) == 1  # a broken chain is never anchored


def test_rewriting_the_tail_behind_a_checkpoint_is_detected(db):
    write_events(5)
    checkpoint_head(now=T0)
    rewind_to(3)
    write_events(2)  # the application carries on: a new #4 and #5 with other content
    report = verify_audit(now=T0 + timedelta(hours=1))
    assert not report.ok and report.first_broken_seq == 5 and "rewritten" in report.reason


def test_a_forged_checkpoint_is_reported(db, settings):
    write_events(3)
    checkpoint_head(now=T0)
    rewind_to(1)
    # The attacker cannot sign, so they edit the checkpoint to match the shortened chain.
    path = Path(settings.AUDIT_CHECKPOINT_DIR) / LOG_NAME
    line = checkpoint_lines(settings)[0]
    line.update(seq=1, hash=AuditEvent.objects.get(seq=1).hash)
    path.write_text(json.dumps(line) + "\n" + json.dumps({**line, "sig": "é"}) + "\nnot json\n")
    report = verify_audit(now=T0 + timedelta(hours=1))
    assert not report.ok and [f"line {n}" in report.reason for n in (1, 2, 3)] == [True] * 3
    assert "forged or altered" in report.reason and path.read_text().count("\n") == 3  # nothing appended


def test_a_checkpoint_signed_with_another_key_is_reported(db, settings, tmp_path):
    write_events(2)
    checkpoint_head(now=T0)
    settings.AUDIT_CHECKPOINT_KEY_FILE = str(tmp_path / "other.key")  # generated: a different key
    report = verify_audit(now=T0)
    assert not report.ok and "forged or altered" in report.reason


def test_a_configured_key_file_that_is_missing_fails_verification(db, settings, tmp_path):
    write_events(1)
    settings.AUDIT_CHECKPOINT_KEY_FILE = str(tmp_path / "mounted" / "missing.key")
    settings.AUDIT_CHECKPOINT_KEY_GENERATE = False
    report = verify_audit(now=T0)
    assert not report.ok and "cannot be read" in report.reason


def test_without_a_key_checkpoints_are_off_and_the_report_says_so(db, settings):
    settings.AUDIT_CHECKPOINT_KEY_FILE = ""
    write_events(2)
    report = verify_audit(now=T0)
    assert report.ok and "checkpoints are off" in report.warning and report.checkpoint_written is None
    assert checkpoint_lines(settings) == []


def test_verify_operation_checks_and_writes_checkpoints(world, settings):
    write_events(2)
    operation = operation_start(actor=principal(world.auditor), kind="audit.verify")
    operation_run(str(operation.pk))
    operation.refresh_from_db()
    assert operation.result["ok"] and operation.result["checkpoint_written"]["seq"] == 2
    rewind_to(1)
    operation = operation_start(actor=principal(world.auditor), kind="audit.verify")
    operation_run(str(operation.pk))
    operation.refresh_from_db()
    assert not operation.result["ok"] and "signed checkpoint" in operation.result["reason"]


@pytest.mark.django_db(transaction=True)
def test_a_batch_is_appended_in_order_under_one_lock_and_chains_like_single_events():
    write_events(2)
    entries = [audit.AuditEntry(actor=system(), action="test.batch", after={"n": n}) for n in range(5)]
    with transaction.atomic():
        events = audit.audit_record_many(entries)
    write_events(1)
    assert [e.after["n"] for e in events] == list(range(5))
    assert [e.seq for e in events] == [3, 4, 5, 6, 7]
    stored = list(AuditEvent.objects.order_by("seq"))
    assert [e.seq for e in stored] == list(range(1, 9))
    assert all(b.prev_hash == a.hash for a, b in pairwise(stored))
    assert AuditChainHead.objects.get(pk=1).seq == 8
    assert verify_chain().ok
    assert audit.audit_record_many([]) == []
