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


def usage_get(principal: Principal, request_id: str) -> UsageRecord:
    """A request traced to what served it; another tenant's request id is simply not found."""
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


def budget_tenants(principal: Principal) -> QuerySet[Tenant]:
    """Tenants with a monthly budget whose costs the caller may read (their own; operators: all)."""
    found = Tenant.objects.filter(monthly_budget__isnull=False).order_by("slug")
    if principal.sees_all(Scope.BILLING_READ):
        return found
    return found.filter(pk__in=principal.tenant_ids_with(Scope.BILLING_READ))
