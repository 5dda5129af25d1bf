"""Delete idempotency records written with an unkeyed SHA-256 of the request body.

A body can carry a password (``POST /users/``); the old fingerprint could be brute-forced offline. The
records only serve retries within 24 hours, so dropping them costs at most that a retry sent across the
upgrade runs as a new request; new records are fingerprinted with HMAC keyed by SECRET_KEY.
"""

from django.db import migrations


def drop(apps, schema_editor):
    apps.get_model("controlplane", "IdempotencyRecord").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0009_bind_tokens_minted_unbound")]

    operations = [migrations.RunPython(drop, migrations.RunPython.noop)]
