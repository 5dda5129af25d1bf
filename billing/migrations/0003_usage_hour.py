from django.db import migrations, models


def fill_hours(apps, schema_editor):  # type: ignore[no-untyped-def]
    UsageRecord = apps.get_model("billing", "UsageRecord")
    for record in UsageRecord.objects.filter(hour__isnull=True).iterator():
        record.hour = record.started_at.replace(minute=0, second=0, microsecond=0)
        record.save(update_fields=["hour"])


def group_statistics(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Tell PostgreSQL how many groups the report's GROUP BY makes, so it picks a hash aggregate."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "CREATE STATISTICS IF NOT EXISTS billing_usage_groups (ndistinct) "
            "ON deployment_id, region, tenant_id, version, hour FROM billing_usagerecord"
        )


def drop_statistics(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP STATISTICS IF EXISTS billing_usage_groups")


class Migration(migrations.Migration):
    dependencies = [("billing", "0002_budgetalert_capacitysegment_gpuprice")]

    operations = [
        migrations.AddField(model_name="usagerecord", name="hour", field=models.DateTimeField(null=True)),
        migrations.RunPython(fill_hours, migrations.RunPython.noop),
        migrations.AlterField(model_name="usagerecord", name="hour", field=models.DateTimeField()),
        migrations.AddIndex(
            model_name="usagerecord",
            index=models.Index(fields=["started_at"], name="billing_usa_started_824101_idx"),
        ),
        migrations.RunPython(group_statistics, drop_statistics),
    ]
