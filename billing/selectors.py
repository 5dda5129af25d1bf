from django.db.models import QuerySet

from billing.models import UsageRecord
from controlplane.choices import Scope
from controlplane.errors import NotFound
from controlplane.principal import Principal


def usage_for(principal: Principal) -> QuerySet[UsageRecord]:
    found = UsageRecord.objects.select_related("tenant", "deployment")
    if principal.sees_all(Scope.BILLING_READ):
        return found
    return found.filter(tenant_id__in=principal.tenant_ids_with(Scope.BILLING_READ))


def usage_get(principal: Principal, request_id: str) -> UsageRecord:
    """A request traced to what served it; another tenant's request id is simply not found."""
    record = usage_for(principal).filter(request_id=request_id).first()
    if record is None:
        raise NotFound(f"No request {request_id!r} is visible to you.")
    return record
