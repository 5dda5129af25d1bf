from django.db import migrations


def group_statistics(apps, schema_editor):  # type: ignore[no-untyped-def]
    """The report's GROUP BY now also has ``pipeline`` and ``stage`` (cost per pipeline stage): the planner's
    group count must keep knowing it, or it stops choosing a hash aggregate (0003). Eight columns is
    PostgreSQL's limit for one statistics object."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP STATISTICS IF EXISTS billing_usage_groups")
        schema_editor.execute(
            "CREATE STATISTICS billing_usage_groups (ndistinct) "
            "ON deployment_id, region, tenant_id, version, hour, track, pipeline, stage FROM billing_usagerecord"
        )


def previous_statistics(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP STATISTICS IF EXISTS billing_usage_groups")
        schema_editor.execute(
            "CREATE STATISTICS billing_usage_groups (ndistinct) "
            "ON deployment_id, region, tenant_id, version, hour, track FROM billing_usagerecord"
        )


class Migration(migrations.Migration):
    dependencies = [("billing", "0009_usage_pipeline_stage")]

    operations = [migrations.RunPython(group_statistics, previous_statistics)]
