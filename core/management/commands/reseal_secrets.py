import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.choices import AuditSource
from core.principal import Principal
from core.services.secrets import secrets_reseal


class Command(BaseCommand):
    help = (
        "After rotating TENANT_SECRETS_KEY (the old key in TENANT_SECRETS_KEY_FALLBACKS): seal every "
        "tenant secret again under the new key, so that the fallback can be removed. Prints the counts; "
        "exits non-zero if a secret opens under none of the keys."
    )

    def handle(self, *args: Any, **opts: Any) -> None:
        counts = secrets_reseal(actor=Principal.system("reseal_secrets", source=AuditSource.COMMAND))
        self.stdout.write(json.dumps(counts))
        if counts["unreadable"]:
            raise CommandError(
                f"{counts['unreadable']} secret(s) open under none of the keys: is the old key among "
                "TENANT_SECRETS_KEY_FALLBACKS? Otherwise their tenants must store them again."
            )
