"""The usage check: a request served where residency does not let its tenant be served (a stale route table,
a misbehaving gateway) is billed all the same, because usage is billing data, but audited and logged, so a
breach is seen instead of silent. The rule is ``core.residency``, as everywhere else."""

import logging
from collections import defaultdict
from collections.abc import Iterable

from billing.models import UsageRecord
from core.choices import AuditSource
from core.models import Tenant
from core.principal import Principal
from core.residency import residency_of, residency_refusal, weights_of
from core.services.audit import audit_record
from regions.models import Deployment, Region

log = logging.getLogger(__name__)
SYSTEM = Principal.system("billing", source=AuditSource.TASK)


def usage_outside_residency(records: Iterable[UsageRecord]) -> list[tuple[UsageRecord, str]]:
    """(record, why) for each record whose region residency forbids for its tenant and deployment's version;
    records whose deployment or region is gone cannot be judged and are left out."""
    records = list(records)
    deployments = Deployment.objects.select_related("version__model__owner").in_bulk(
        {r.deployment_id for r in records if r.deployment_id}
    )
    jurisdiction = dict(
        Region.objects.filter(code__in={r.region for r in records}).values_list("code", "jurisdiction")
    )
    tenants = Tenant.objects.in_bulk({r.tenant_id for r in records})
    found = []
    for record in records:
        deployment = deployments.get(record.deployment_id) if record.deployment_id else None
        if deployment is None or record.region not in jurisdiction:
            continue
        why = residency_refusal(
            weights_of(deployment.version),
            jurisdiction[record.region],
            serving=residency_of(tenants[record.tenant_id]),
        )
        if why is not None:
            found.append((record, why))
    return found


def audit_usage_outside_residency(records: Iterable[UsageRecord]) -> int:
    """One audit event per tenant for the records of a batch served outside residency; how many there were.
    Call inside the transaction that stores them."""
    by_tenant: dict[int, list[tuple[UsageRecord, str]]] = defaultdict(list)
    for record, why in usage_outside_residency(records):
        by_tenant[record.tenant_id].append((record, why))
    tenants = Tenant.objects.in_bulk(list(by_tenant))
    for tenant_id, breaches in by_tenant.items():
        record, why = breaches[0]
        message = (
            f"{len(breaches)} request(s) served outside residency, e.g. {record.request_id} in "
            f"{record.region}: {why}"
        )
        log.warning("%s: %s", tenants[tenant_id].slug, message)
        audit_record(
            actor=SYSTEM, action="usage.outside_residency", tenant=tenants[tenant_id], message=message
        )
    return sum(len(breaches) for breaches in by_tenant.values())
