"""Every read the API, dashboard and tasks make, already narrowed to what the principal may see.

Objects outside that set are simply absent (the API answers 404), so a tenant can never learn that
another tenant's object exists.
"""

from typing import TypeVar

from django.db.models import Model, Q, QuerySet

from controlplane.choices import PlatformRole, Scope
from controlplane.errors import NotFound
from controlplane.models import ApiToken, AuditEvent, Membership, Operation, ServiceAccount, Tenant, User
from controlplane.principal import Principal


def _tenant_filter(principal: Principal, scope: str, field: str = "tenant") -> Q | None:
    """None means everything; otherwise the condition limiting rows to the principal's tenants."""
    if principal.sees_all(scope):
        return None
    return Q(**{f"{field}__in": principal.tenant_ids_with(scope)})


M = TypeVar("M", bound=Model)


def _scoped(queryset: QuerySet[M], principal: Principal, scope: str, field: str = "tenant") -> QuerySet[M]:
    condition = _tenant_filter(principal, scope, field)
    return queryset if condition is None else queryset.filter(condition)


def tenants_for(principal: Principal) -> QuerySet[Tenant]:
    return _scoped(Tenant.objects.all(), principal, Scope.TENANTS_READ, field="pk")


def tenant_get(principal: Principal, slug: str) -> Tenant:
    tenant = tenants_for(principal).filter(slug=slug).first()
    if tenant is None:
        raise NotFound(f"No tenant '{slug}'.")
    return tenant


def tenant_for_action(principal: Principal, slug: str) -> Tenant:
    """The tenant a write names. Who may know that it exists — platform staff, and its own members and
    robots, whatever their token's scopes — gets it (and then the service's 403 if a scope is missing);
    anyone else gets the same 404 as for a tenant that does not exist."""
    tenant = Tenant.objects.filter(slug=slug).first()
    knows = tenant is not None and (
        principal.platform_role != PlatformRole.NONE or tenant.pk in principal.tenant_roles
    )
    if tenant is None or not knows:
        raise NotFound(f"No tenant '{slug}'.")
    return tenant


def memberships_for(principal: Principal, tenant: Tenant | None = None) -> QuerySet[Membership]:
    queryset = _scoped(Membership.objects.select_related("user", "tenant"), principal, Scope.TENANTS_READ)
    return queryset.filter(tenant=tenant) if tenant is not None else queryset


def users_for(principal: Principal) -> QuerySet[User]:
    """Platform readers see every user; tenant members see the people of their own tenants."""
    if principal.sees_all(Scope.TENANTS_READ):
        return User.objects.all().order_by("username")
    tenant_ids = principal.tenant_ids_with(Scope.TENANTS_READ)
    return User.objects.filter(memberships__tenant_id__in=tenant_ids).distinct().order_by("username")


def user_get(principal: Principal, username: str) -> User:
    user = users_for(principal).filter(username=username).first()
    if user is None:
        raise NotFound(f"No user '{username}'.")
    return user


def user_by_username(username: str) -> User:
    """Any active user, for adding members: inviting someone needs only their exact username."""
    user = User.objects.filter(username=username, is_active=True).first()
    if user is None:
        raise NotFound(f"No user '{username}'.")
    return user


def service_accounts_for(principal: Principal) -> QuerySet[ServiceAccount]:
    queryset = ServiceAccount.objects.select_related("tenant")
    if principal.sees_all(Scope.TENANTS_READ):
        return queryset
    return queryset.filter(tenant_id__in=principal.tenant_ids_with(Scope.TENANTS_READ))


def tokens_for(principal: Principal) -> QuerySet[ApiToken]:
    """Your own tokens, plus robot tokens of tenants whose tokens you manage (all, for platform admins)."""
    queryset = ApiToken.objects.select_related("user", "service_account__tenant")
    if principal.may(Scope.USERS_WRITE):
        return queryset
    own = Q(user_id=principal.user.pk) if principal.user is not None else Q(pk__in=[])
    managed = Q(service_account__tenant_id__in=principal.tenant_ids_with(Scope.TOKENS_WRITE))
    return queryset.filter(own | managed)


def token_get(principal: Principal, pk: int) -> ApiToken:
    token = tokens_for(principal).filter(pk=pk).first()
    if token is None:
        raise NotFound(f"No token {pk}.")
    return token


def audit_events_for(principal: Principal) -> QuerySet[AuditEvent]:
    """Auditors and admins read the whole chain; tenant members with audit:read their tenant's events."""
    return _scoped(AuditEvent.objects.all(), principal, Scope.AUDIT_READ)


def operations_for(principal: Principal) -> QuerySet[Operation]:
    if principal.sees_all(Scope.AUDIT_READ):
        return Operation.objects.all()
    mine = Q(created_by_key=principal.key)
    return Operation.objects.filter(mine | Q(tenant_id__in=principal.tenant_ids_with(Scope.TENANTS_READ)))


def operation_get(principal: Principal, pk: str) -> Operation:
    operation = operations_for(principal).filter(pk=pk).first()
    if operation is None:
        raise NotFound(f"No operation {pk}.")
    return operation
