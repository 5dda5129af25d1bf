from django.db.models import QuerySet

from billing.models import BudgetAlert, UsageRecord
from controlplane.choices import Scope
from controlplane.errors import Forbidden, NotFound
from controlplane.models import Tenant
from controlplane.principal import Principal


def usage_for(principal: Principal) -> QuerySet[UsageRecord]:
    found = UsageRecord.objects.select_related("tenant", "deployment")
    if principal.sees_all(Scope.BILLING_READ):
        return found
    return found.filter(tenant_id__in=principal.tenant_ids_with(Scope.BILLING_READ))


def usage_list(principal: Principal, client_request_id: str | None = None) -> QuerySet[UsageRecord]:
    """The caller's records, newest first; a client's own X-Request-ID finds its tenants' requests only."""
    found = usage_for(principal)
    if client_request_id is not None:
        found = found.filter(client_request_id=client_request_id)
    return found


def usage_get(principal: Principal, request_id: str) -> UsageRecord:
    """A request traced (by the gateway's id) to what served it; another tenant's is simply not found."""
    record = usage_for(principal).filter(request_id=request_id).first()
    if record is None:
        raise NotFound(f"No request {request_id!r} is visible to you.")
    return record


def cost_tenants(principal: Principal) -> set[str] | None:
    """The tenants whose costs the caller sees (None: all of them, and idle capacity)."""
    if principal.sees_all(Scope.BILLING_READ):
        return None
    require_cost_reader(principal)
    ids = principal.tenant_ids_with(Scope.BILLING_READ)
    return set(Tenant.objects.filter(pk__in=ids).values_list("slug", flat=True))


def require_cost_reader(principal: Principal) -> None:
    if not principal.sees_all(Scope.BILLING_READ) and not principal.tenant_ids_with(Scope.BILLING_READ):
        raise Forbidden("This needs the 'billing:read' permission.", detail={"scope": Scope.BILLING_READ})


def budget_alerts(principal: Principal) -> QuerySet[BudgetAlert]:
    found = BudgetAlert.objects.select_related("tenant")
    if principal.sees_all(Scope.BILLING_READ):
        return found
    return found.filter(tenant_id__in=principal.tenant_ids_with(Scope.BILLING_READ))
