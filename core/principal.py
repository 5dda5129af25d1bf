"""Who is acting, and what they may do.

A ``Principal`` is built once per request (from a session or a bearer token), per task or per command,
and is what every service and selector takes. Its power in a tenant is the union of its platform role
and its role in that tenant, intersected with the token's scopes when it came with a token.
"""

from dataclasses import dataclass, field
from functools import cached_property

from core.choices import (
    PLATFORM_ROLE_SCOPES,
    TENANT_ROLE_SCOPES,
    ActorType,
    AuditSource,
    PlatformRole,
    Scope,
)
from core.errors import Forbidden
from core.models import ApiToken, ServiceAccount, User


@dataclass
class Principal:
    kind: str
    name: str
    source: str
    user: User | None = None
    service_account: ServiceAccount | None = None
    token: ApiToken | None = None
    platform_role: str = PlatformRole.NONE
    tenant_roles: dict[int, str] = field(default_factory=dict)
    token_scopes: frozenset[str] | None = None
    # While a list (an idempotent request records into it), every require()/require_any() passed; a
    # replay re-checks them. None otherwise, so long-lived principals (tasks' SYSTEM) record nothing.
    passed_checks: list[dict[str, object]] | None = field(default=None, repr=False, compare=False)

    is_authenticated = True
    is_anonymous = False

    @classmethod
    def for_user(cls, user: User, *, source: str, token: ApiToken | None = None) -> "Principal":
        roles = dict(user.memberships.values_list("tenant_id", "role"))
        if token is not None and token.tenant_id is not None:  # a bound token acts in its tenant only
            roles = {tid: role for tid, role in roles.items() if tid == token.tenant_id}
        elif token is not None and user.platform_role != PlatformRole.NONE:
            roles = {}  # a platform principal's unbound token is a platform token: it never gains a tenant
        return cls(
            kind=ActorType.USER,
            name=user.username,
            source=source,
            user=user,
            token=token,
            platform_role=user.platform_role,
            tenant_roles=roles,
            token_scopes=frozenset(token.scopes) if token else None,
        )

    @classmethod
    def for_service_account(cls, robot: ServiceAccount, *, token: ApiToken, source: str) -> "Principal":
        tenant_roles = {robot.tenant_id: robot.role} if robot.tenant_id else {}
        return cls(
            kind=ActorType.SERVICE_ACCOUNT,
            name=str(robot),
            source=source,
            service_account=robot,
            token=token,
            platform_role="" if robot.tenant_id else robot.role,
            tenant_roles=tenant_roles,
            token_scopes=frozenset(token.scopes),
        )

    @classmethod
    def system(cls, name: str, *, source: str = AuditSource.SYSTEM) -> "Principal":
        """The platform acting on its own (reconciler, scheduled jobs, management commands)."""
        return cls(kind=ActorType.SYSTEM, name=name, source=source, platform_role=PlatformRole.ADMIN)

    def _limit(self, scopes: frozenset[str]) -> frozenset[str]:
        return scopes if self.token_scopes is None else scopes & self.token_scopes

    @cached_property
    def platform_scopes(self) -> frozenset[str]:
        return self._limit(PLATFORM_ROLE_SCOPES.get(self.platform_role, frozenset()))

    def tenant_scopes(self, tenant_id: int | None) -> frozenset[str]:
        role = self.tenant_roles.get(tenant_id) if tenant_id is not None else None
        return self.platform_scopes | self._limit(
            TENANT_ROLE_SCOPES.get(role, frozenset()) if role else frozenset()
        )

    @property
    def all_scopes(self) -> frozenset[str]:
        """Every scope this principal holds somewhere: the ceiling for the tokens it may mint."""
        scopes = set(self.platform_scopes)
        for tenant_id in self.tenant_roles:
            scopes |= self.tenant_scopes(tenant_id)
        return frozenset(scopes)

    def sees_all(self, scope: str) -> bool:
        return scope in self.platform_scopes

    def may(self, scope: str, tenant_id: int | None = None) -> bool:
        return scope in self.tenant_scopes(tenant_id)

    def tenant_ids_with(self, scope: str) -> set[int]:
        return {tid for tid in self.tenant_roles if scope in self.tenant_scopes(tid)}

    def require(self, scope: str, tenant_id: int | None = None) -> None:
        if not self.may(scope, tenant_id):
            where = "on this tenant" if tenant_id is not None else "platform-wide"
            raise Forbidden(f"This action needs the '{scope}' permission {where}.", detail={"scope": scope})
        if self.passed_checks is not None:
            self.passed_checks.append({"scope": scope, "tenant": tenant_id})

    def require_gateway(self) -> None:
        """What only gateways get (engines' keys, tenants' secrets and indexes) goes to a gateway's own
        service account (``gateway:sync``), never to a person, whatever role they hold."""
        self.require(Scope.GATEWAY_SYNC)
        if self.service_account is None:
            raise Forbidden(
                "Only a gateway's service account reads engines' keys and tenants' secrets, not a person.",
                detail={"scope": Scope.GATEWAY_SYNC},
            )

    def require_any(self, scope: str) -> None:
        """The principal holds ``scope`` somewhere (platform-wide or in at least one tenant)."""
        if scope not in self.all_scopes:
            raise Forbidden(f"This needs the '{scope}' permission.", detail={"scope": scope})
        if self.passed_checks is not None:
            self.passed_checks.append({"scope": scope, "anywhere": True})

    def recheck(self, checks: list[dict[str, object]]) -> None:
        """Pass again every check another request of this credential passed (raises Forbidden)."""
        for check in checks:
            scope = str(check["scope"])
            if check.get("anywhere"):
                self.require_any(scope)
            else:
                tenant = check.get("tenant")
                self.require(scope, int(tenant) if isinstance(tenant, int) else None)

    @property
    def bound_tenant_id(self) -> int | None:
        """The tenant the credential is bound to: then "your own" tokens and operations are those of that
        tenant only, never the owner's things in their other tenants."""
        return self.token.tenant_id if self.token is not None else None

    def owns(self, user_id: int | None, tenant_id: int | None) -> bool:
        """A thing of ``user_id`` (in ``tenant_id``) is this principal's own."""
        if self.user is None or user_id != self.user.pk:
            return False
        return self.bound_tenant_id is None or tenant_id == self.bound_tenant_id

    @property
    def actor_id(self) -> str:
        if self.user is not None:
            return str(self.user.pk)
        if self.service_account is not None:
            return str(self.service_account.pk)
        return ""

    @property
    def key(self) -> str:
        """A stable identity, e.g. for idempotency keys and rate limits."""
        return f"{self.kind}:{self.actor_id or self.name}"
