"""Create the audit chain's head row and, on PostgreSQL, make the audit table append-only."""

from django.db import migrations

GENESIS_HASH = "0" * 64

TRIGGER_SQL = """
CREATE OR REPLACE FUNCTION controlplane_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER controlplane_audit_append_only
    BEFORE UPDATE OR DELETE ON controlplane_auditevent
    FOR EACH ROW EXECUTE FUNCTION controlplane_audit_append_only();
"""
DROP_SQL = """
DROP TRIGGER IF EXISTS controlplane_audit_append_only ON controlplane_auditevent;
DROP FUNCTION IF EXISTS controlplane_audit_append_only();
"""


def create_head(apps, schema_editor):
    apps.get_model("controlplane", "AuditChainHead").objects.get_or_create(pk=1, defaults={"seq": 0, "hash": GENESIS_HASH})


def add_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TRIGGER_SQL, params=None)


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_SQL, params=None)


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0001_initial")]

    operations = [
        migrations.RunPython(create_head, migrations.RunPython.noop),
        migrations.RunPython(add_trigger, drop_trigger),
    ]
