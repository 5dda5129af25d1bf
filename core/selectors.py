"""Every read the API, dashboard and tasks make, already narrowed to what the principal may see.

Objects outside that set are simply absent (the API answers 404), so a tenant can never learn that
another tenant's object exists.
"""

from datetime import datetime
from typing import TypeVar

from django.db.models import Model, Q, QuerySet

from core.choices import Scope
from core.errors import NotFound
from core.models import (
    ApiToken,
    AuditEvent,
    Invitation,
    Membership,
    Operation,
    ServiceAccount,
    Tenant,
    TenantSecret,
    User,
)
from core.principal import Principal


def visible_tenant_ids(principal: Principal, scope: str | None) -> set[int] | None:
    """The one answer to "which tenants may this caller see"; None means every tenant.

    With a ``scope``: the tenants where the caller holds it (all of them when its platform role does).
    With ``None``: the tenants the caller belongs to (a membership, or a tenant robot's own tenant),
    whatever its scopes there: membership is not the permission to read a tenant's details, and a
    caller may always name its own tenant (e.g. as an owner); the service then checks the action's
    scope. A platform principal holding any platform scope sees every tenant.
    """
    if scope is None:
        return None if principal.platform_scopes else set(principal.tenant_roles)
    if principal.sees_all(scope):
        return None
    return principal.tenant_ids_with(scope)


def _tenant_filter(principal: Principal, scope: str | None, field: str = "tenant") -> Q | None:
    """None means everything; otherwise the condition limiting rows to the principal's tenants."""
    ids = visible_tenant_ids(principal, scope)
    return None if ids is None else Q(**{f"{field}__in": ids})


M = TypeVar("M", bound=Model)


def scoped(
    queryset: QuerySet[M], principal: Principal, scope: str | None, field: str = "tenant"
) -> QuerySet[M]:
    """``queryset`` narrowed to the rows of the tenants ``visible_tenant_ids`` names (via ``field``)."""
    condition = _tenant_filter(principal, scope, field)
    return queryset if condition is None else queryset.filter(condition)


def tenants_for(principal: Principal, scope: str | None = Scope.TENANTS_READ) -> QuerySet[Tenant]:
    """Tenants where the caller holds ``scope`` (default: may read their details); None: its own."""
    return scoped(Tenant.objects.all(), principal, scope, field="pk")


def visible_tenant_slugs(principal: Principal, scope: str) -> set[str] | None:
    """``visible_tenant_ids`` as slugs (None: every tenant), for views keyed by slug: the route table and
    cost reports."""
    if visible_tenant_ids(principal, scope) is None:
        return None
    return set(tenants_for(principal, scope).values_list("slug", flat=True))


def tenants_joined(principal: Principal) -> QuerySet[Tenant]:
    """The tenants the caller is a member of (its role there in ``principal.tenant_roles``), whatever
    its platform role: for /me/ and for choosing the tenant a new token is bound to."""
    return Tenant.objects.filter(pk__in=principal.tenant_roles)


def tenant_get(principal: Principal, slug: str, scope: str | None = Scope.TENANTS_READ) -> Tenant:
    """A tenant the caller belongs to, by slug (404 otherwise, so existence is not revealed); 403 when
    it belongs there but lacks ``scope`` (None: resolve only, the service checks the action)."""
    tenant = tenants_for(principal, None).filter(slug=slug).first()
    if tenant is None:
        raise NotFound(f"No tenant '{slug}'.")
    if scope is not None:
        principal.require(scope, tenant.pk)
    return tenant


def memberships_for(principal: Principal, tenant: Tenant | None = None) -> QuerySet[Membership]:
    queryset = scoped(Membership.objects.select_related("user", "tenant"), principal, Scope.TENANTS_READ)
    return queryset.filter(tenant=tenant) if tenant is not None else queryset


def users_for(principal: Principal) -> QuerySet[User]:
    """Platform readers see every user; tenant members see the people of their own tenants."""
    found = scoped(User.objects.all(), principal, Scope.TENANTS_READ, field="memberships__tenant")
    return found.distinct().order_by("username")


def user_get(principal: Principal, username: str) -> User:
    user = users_for(principal).filter(username=username).first()
    if user is None:
        raise NotFound(f"No user '{username}'.")
    return user


def invitations_of_tenant(principal: Principal, tenant: Tenant) -> QuerySet[Invitation]:
    """A tenant's invitations, for those who manage its members."""
    principal.require(Scope.MEMBERS_WRITE, tenant.pk)
    return Invitation.objects.filter(tenant=tenant).select_related("tenant", "user")


def invitation_of_tenant_get(principal: Principal, tenant: Tenant, pk: int) -> Invitation:
    invitation = invitations_of_tenant(principal, tenant).filter(pk=pk).first()
    if invitation is None:
        raise NotFound(f"No invitation {pk} in {tenant.slug}.")
    return invitation


def invitations_to(principal: Principal) -> QuerySet[Invitation]:
    """The invitations addressed to the calling person (none for robots)."""
    if principal.user is None:
        return Invitation.objects.none()
    return Invitation.objects.filter(user=principal.user).select_related("tenant", "user")


def invitation_to_get(principal: Principal, pk: int) -> Invitation:
    invitation = invitations_to(principal).filter(pk=pk).first()
    if invitation is None:
        raise NotFound(f"No invitation {pk} for you.")
    return invitation


def user_by_username(username: str) -> User:
    """Any active user, for adding members: inviting someone needs only their exact username."""
    user = User.objects.filter(username=username, is_active=True).first()
    if user is None:
        raise NotFound(f"No user '{username}'.")
    return user


def service_accounts_for(principal: Principal) -> QuerySet[ServiceAccount]:
    return scoped(ServiceAccount.objects.select_related("tenant"), principal, Scope.TENANTS_READ)


def tokens_for(principal: Principal) -> QuerySet[ApiToken]:
    """Your own tokens, plus robot tokens of tenants whose tokens you manage (all, for platform admins)."""
    queryset = ApiToken.objects.select_related("user", "service_account__tenant", "tenant")
    if principal.may(Scope.USERS_WRITE):
        return queryset
    own = _own(principal, Q(user_id=principal.user.pk) if principal.user is not None else Q(pk__in=[]))
    managed = _tenant_filter(principal, Scope.TOKENS_WRITE, "service_account__tenant")
    if managed is None:  # tokens:write platform-wide: every tenant robot's tokens
        managed = Q(service_account__tenant__isnull=False)
    return queryset.filter(own | managed)


def tokens_active(principal: Principal, *, now: datetime) -> QuerySet[ApiToken]:
    """The visible tokens that would authenticate at ``now``: not revoked, not expired, owner active."""
    live_owner = Q(user__is_active=True) | Q(service_account__is_active=True)
    unexpired = Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    return tokens_for(principal).filter(live_owner, unexpired, revoked_at__isnull=True)


def token_get(principal: Principal, pk: int) -> ApiToken:
    token = tokens_for(principal).filter(pk=pk).first()
    if token is None:
        raise NotFound(f"No token {pk}.")
    return token


def audit_events_for(principal: Principal) -> QuerySet[AuditEvent]:
    """Auditors and admins read the whole chain; tenant members with audit:read their tenant's events."""
    return scoped(AuditEvent.objects.all(), principal, Scope.AUDIT_READ)


def operations_for(principal: Principal) -> QuerySet[Operation]:
    if principal.sees_all(Scope.AUDIT_READ):
        return Operation.objects.all()
    theirs = _tenant_filter(principal, Scope.TENANTS_READ)
    if theirs is None:
        return Operation.objects.all()
    return Operation.objects.filter(_own(principal, Q(created_by_key=principal.key)) | theirs)


def _own(principal: Principal, mine: Q) -> Q:
    """What is the principal's own; with a bound token, only in that tenant (Principal.owns, as a query)."""
    bound = principal.bound_tenant_id
    return mine if bound is None else mine & Q(tenant_id=bound)


def operation_get(principal: Principal, pk: str) -> Operation:
    operation = operations_for(principal).filter(pk=pk).first()
    if operation is None:
        raise NotFound(f"No operation {pk}.")
    return operation


def secrets_of(principal: Principal, tenant: Tenant) -> QuerySet[TenantSecret]:
    """A tenant's secrets (names and revisions: values are never read out), for its readers."""
    principal.require(Scope.TENANTS_READ, tenant.pk)
    return TenantSecret.objects.filter(owner=tenant)


def secret_get(principal: Principal, tenant: Tenant, name: str) -> TenantSecret:
    secret = secrets_of(principal, tenant).filter(name=name).first()
    if secret is None:
        raise NotFound(f"No secret '{tenant.slug}/{name}'.")
    return secret
