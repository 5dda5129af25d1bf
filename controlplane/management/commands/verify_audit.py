import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from controlplane.services.audit import verify_chain


class Command(BaseCommand):
    help = "Verify the audit hash chain; exits non-zero and names the first broken link if it does not hold."

    def handle(self, *args: Any, **opts: Any) -> None:
        report = verify_chain()
        self.stdout.write(json.dumps(report.as_dict()))
        if not report.ok:
            raise CommandError(f"Audit chain broken at #{report.first_broken_seq}: {report.reason}")
