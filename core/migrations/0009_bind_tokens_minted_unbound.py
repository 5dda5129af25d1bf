"""Bind the tokens minted unbound between 0007 and the rule that every personal token is bound.

Until then a person's token without ``models:invoke`` was minted unbound even when its owner belonged to
exactly one tenant. This runs 0007's binding again (it only touches unbound tokens, so it is idempotent):
the same unambiguous cases are bound, the others (people in several tenants or none, platform service
accounts) stay unbound as 0007 left them.
"""

import importlib

from django.db import migrations

bind = importlib.import_module("core.migrations.0007_bind_existing_tokens").bind


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0008_auditevent_hash_version")]

    operations = [migrations.RunPython(bind, migrations.RunPython.noop)]
