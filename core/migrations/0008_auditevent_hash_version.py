"""Record which hash format each audit event was written with.

Events that exist before this migration were hashed with format 1 (which does not cover ``tenant_id``)
and get ``hash_version = 1``; they keep verifying with that formula, so nothing is re-hashed and the
append-only trigger (0002) stays in force: adding a column with a default is ALTER TABLE, not UPDATE,
and fires no row trigger. New events are written with the current format (services.audit.HASH_VERSION).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0007_bind_existing_tokens"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="hash_version",
            field=models.PositiveSmallIntegerField(default=1),
            preserve_default=False,
        ),
    ]
