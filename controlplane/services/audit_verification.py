"""Chain verification as a long-running operation (POST /api/v1/audit/verify answers 202)."""

from typing import Any

from django.db import transaction

from controlplane.choices import AuditSource
from controlplane.models import Operation
from controlplane.principal import Principal
from controlplane.services.audit import audit_record, verify_chain
from controlplane.services.operations import operation_handler


@operation_handler("audit.verify")
def verify_audit_operation(operation: Operation) -> dict[str, Any]:
    report = verify_chain()
    with transaction.atomic():
        audit_record(
            actor=Principal.system("audit-verifier", source=AuditSource.TASK),
            action="audit.chain_verified" if report.ok else "audit.chain_broken",
            target=operation,
            after=report.as_dict(),
            message=f"Requested by {operation.created_by_name}. {report.reason}".strip(),
        )
    return report.as_dict()
