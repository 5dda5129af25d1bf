"""The usage check: a request served where residency does not let its tenant be served (a stale route table,
a misbehaving gateway) is billed all the same, because usage is billing data, but audited and logged, so a
breach is seen instead of silent. A mirrored copy is checked like any request (it carried the tenant's
prompt), though never billed. The rule is ``core.residency``, as everywhere else.

During a rollout a deployment serves two versions, whose weights may be allowed in different places: a
record is judged by the version it names (``model@version``), the deployment's own only when that one is
not found."""

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
from registry.models import ModelVersion

log = logging.getLogger(__name__)
SYSTEM = Principal.system("billing", source=AuditSource.TASK)


def usage_outside_residency(records: Iterable[UsageRecord]) -> list[tuple[UsageRecord, str]]:
    """(record, why) for each record whose region residency forbids for its tenant and the version it names
    (else its deployment's); records whose deployment or region is gone cannot be judged and are left out."""
    records = list(records)
    deployments = Deployment.objects.select_related("version__model__owner").in_bulk(
        {r.deployment_id for r in records if r.deployment_id}
    )
    served = _versions_named(records, deployments)
    jurisdiction = dict(
        Region.objects.filter(code__in={r.region for r in records}).values_list("code", "jurisdiction")
    )
    tenants = Tenant.objects.in_bulk({r.tenant_id for r in records})
    found = []
    for record in records:
        deployment = deployments.get(record.deployment_id) if record.deployment_id else None
        if deployment is None or record.region not in jurisdiction:
            continue
        version = served.get((deployment.model_id, _version_part(record.version)), deployment.version)
        why = residency_refusal(
            weights_of(version),
            jurisdiction[record.region],
            serving=residency_of(tenants[record.tenant_id]),
        )
        if why is not None:
            found.append((record, why))
    return found


def _version_part(named: str) -> str:
    """``owner/model@1.2.0`` → ``1.2.0`` (a version string has no ``@``)."""
    return named.rpartition("@")[2]


def _versions_named(
    records: list[UsageRecord], deployments: dict[int, Deployment]
) -> dict[tuple[int, str], ModelVersion]:
    """The versions the records name, of their deployments' models, in one query."""
    wanted = {
        (deployments[r.deployment_id].model_id, _version_part(r.version))
        for r in records
        if r.deployment_id in deployments and r.version
    }
    if not wanted:
        return {}
    found = ModelVersion.objects.select_related("model__owner").filter(
        model_id__in={model for model, _ in wanted}, version__in={version for _, version in wanted}
    )
    return {(v.model_id, v.version): v for v in found if (v.model_id, v.version) in wanted}


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
