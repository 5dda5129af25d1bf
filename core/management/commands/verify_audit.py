import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from core.services.audit_verification import verify_audit


class Command(BaseCommand):
    help = (
        "Verify the audit hash chain against the signed checkpoints, then checkpoint the verified head; "
        "exits non-zero and names the first broken link (or the bad checkpoint) if it does not hold."
    )

    def handle(self, *args: Any, **opts: Any) -> None:
        report = verify_audit(now=timezone.now())
        self.stdout.write(json.dumps(report.as_dict()))
        if report.warning:
            self.stderr.write(f"warning: {report.warning}")
        if not report.ok:
            where = f" at #{report.first_broken_seq}" if report.first_broken_seq is not None else ""
            raise CommandError(f"Audit chain broken{where}: {report.reason}")
