"""Chain verification against the signed checkpoints: the command and the API operation (202) both
call ``verify_audit``."""

from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.choices import AuditSource
from core.models import Operation
from core.principal import Principal
from core.services.audit import ChainReport, audit_record, verify_chain
from core.services.audit_checkpoints import CheckpointLog, checkpoint_append, checkpoints_read
from core.services.operations import operation_handler

UNDETECTABLE = "deleting the newest events and rewinding the head row cannot be detected"


def _coverage_warning(log: CheckpointLog, report: ChainReport) -> str:
    """What this verification could not have caught: events newer than the newest checkpoint."""
    latest = log.latest
    if not log.enabled:
        return f"checkpoints are off (AUDIT_CHECKPOINT_KEY_FILE is not set): {UNDETECTABLE}"
    if latest is None:
        return f"no signed checkpoint yet: {UNDETECTABLE}"
    if latest.seq < report.checked:
        at = latest.at.isoformat()
        return (
            f"events after #{latest.seq} (signed checkpoint of {at}) were not covered by a checkpoint: "
            "had they been deleted and the head rewound, it would not have been detected"
        )
    return ""


def verify_audit(*, now: datetime) -> ChainReport:
    """Verify the chain against every signed checkpoint; when all holds, checkpoint the verified head."""
    log = checkpoints_read()
    report = verify_chain(checkpoints=log.checkpoints)
    latest = log.latest
    report = replace(
        report, checkpoint=latest.as_dict() if latest else None, warning=_coverage_warning(log, report)
    )
    if log.problems:
        return replace(report, ok=False, reason="; ".join(filter(None, [report.reason, *log.problems])))
    if not report.ok or report.checked == 0 or not log.enabled:
        return report
    if latest is not None and (latest.seq, latest.hash) == (report.checked, report.head_hash):
        return report
    written = checkpoint_append(seq=report.checked, hash=report.head_hash, at=now)
    return replace(report, checkpoint_written=written.as_dict() if written else None)


@operation_handler("audit.verify")
def verify_audit_operation(operation: Operation) -> dict[str, Any]:
    report = verify_audit(now=timezone.now())
    with transaction.atomic():
        audit_record(
            actor=Principal.system("audit-verifier", source=AuditSource.TASK),
            action="audit.chain_verified" if report.ok else "audit.chain_broken",
            target=operation,
            after=report.as_dict(),
            message=f"Requested by {operation.created_by_name}. {report.reason}".strip(),
        )
    return report.as_dict()
