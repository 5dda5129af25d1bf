"""API tokens: minted once, stored as a hash, checked on every API call, revocable."""

import hashlib
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.choices import ALL_SCOPES, PLATFORM_ROLE_SCOPES, TENANT_ROLE_SCOPES, Priority, Scope
from core.errors import Conflict, Forbidden, ValidationFailed
from core.models import ApiToken, ServiceAccount, Tenant
from core.principal import Principal
from core.services.audit import audit_record

TOKEN_PREFIX = "cpt_"


class TokenRejected(Exception):
    """The bearer token is unknown, expired or revoked (HTTP 401)."""


def token_digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _robot_scopes(robot: ServiceAccount) -> frozenset[str]:
    table = TENANT_ROLE_SCOPES if robot.tenant_id else PLATFORM_ROLE_SCOPES
    return table.get(robot.role, frozenset())


def token_binding(
    *, actor: Principal, robot: ServiceAccount | None, tenant: Tenant | None, scopes: list[str]
) -> Tenant | None:
    """The one tenant a new token acts in and is served for at the gateway (None: unbound).

    - a tenant robot's token is bound to the robot's tenant;
    - a token minted with a bound token is bound to that same tenant (a bound credential never mints
      its way out of its tenant);
    - a person's token is bound to the tenant named, which must be one they belong to, or else to their
      only tenant; unbound (platform-only) personal tokens are for platform principals without a tenant
      named, and a ``models:invoke`` token is always bound (it is used at the gateway).
    """
    if robot is not None and robot.tenant is not None:
        return _same_tenant(robot.tenant, tenant, f"A token of {robot}")
    if actor.token is not None and actor.token.tenant is not None:
        return _same_tenant(actor.token.tenant, tenant, "A token minted with a bound token")
    if robot is not None:
        if tenant is None and Scope.MODELS_INVOKE in scopes:
            raise _name_the_tenant("A token with models:invoke is used at the gateway and must be bound")
        return tenant
    if tenant is not None:
        if tenant.pk not in actor.tenant_roles:
            raise ValidationFailed(
                f"A personal token is bound to a tenant its owner is a member of; you are not a member of "
                f"{tenant.slug}.",
                detail={"tenant": ["Not a member."]},
            )
        return tenant
    own = list(actor.tenant_roles)
    if len(own) == 1:
        return Tenant.objects.get(pk=own[0])
    if Scope.MODELS_INVOKE in scopes:
        raise _name_the_tenant("A token with models:invoke is used at the gateway and must be bound")
    if own or not actor.platform_scopes:
        raise _name_the_tenant("A personal token is bound")
    return None


def _same_tenant(bound: Tenant, named: Tenant | None, what: str) -> Tenant:
    if named is not None and named.pk != bound.pk:
        raise ValidationFailed(f"{what} is bound to {bound.slug}.", detail={"tenant": ["Mismatch."]})
    return bound


def _name_the_tenant(why: str) -> ValidationFailed:
    return ValidationFailed(f"{why} to one tenant: name the tenant.", detail={"tenant": ["Required."]})


def _check_owner(
    actor: Principal, robot: ServiceAccount | None, tenant: Tenant | None = None
) -> frozenset[str]:
    """Who may mint for whom; returns the scopes the new token's owner can hold at most."""
    if robot is None:
        if actor.user is None:
            raise Forbidden("Only a person can own a personal token; name a service account instead.")
        return actor.all_scopes if tenant is None else actor.tenant_scopes(tenant.pk)
    actor.require(*robot_tokens_permission(robot))
    if not robot.is_active:
        raise Conflict(f"Service account {robot} is deactivated.")
    return _robot_scopes(robot)


def _check_scopes(scopes: list[str], ceiling: frozenset[str]) -> list[str]:
    unknown = sorted(set(scopes) - ALL_SCOPES)
    if unknown:
        raise ValidationFailed(f"Unknown scope(s): {', '.join(unknown)}.", detail={"scopes": unknown})
    if not scopes:
        raise ValidationFailed("A token needs at least one scope.", detail={"scopes": ["Required."]})
    beyond = sorted(set(scopes) - ceiling)
    if beyond:
        raise Forbidden(
            f"The token's owner does not hold scope(s) {', '.join(beyond)}, so the token cannot have them.",
            detail={"scopes": beyond},
        )
    return sorted(set(scopes))


def token_create(
    *,
    actor: Principal,
    name: str,
    scopes: list[str],
    expires_at: datetime | None = None,
    service_account: ServiceAccount | None = None,
    tenant: Tenant | None = None,
    priority: str = Priority.INTERACTIVE,
) -> tuple[ApiToken, str]:
    """Mint a token; the secret is returned here once and never stored. ``tenant`` binds it; ``priority``
    is the class of its requests at the gateway."""
    tenant = token_binding(actor=actor, robot=service_account, tenant=tenant, scopes=scopes)
    granted = _check_scopes(scopes, _check_owner(actor, service_account, tenant))
    if not name or len(name) > 100:
        raise ValidationFailed("A token needs a name of 1 to 100 characters.", detail={"name": ["Invalid."]})
    if priority not in Priority.values:
        raise ValidationFailed(
            f"priority must be one of {', '.join(Priority.values)}.", detail={"priority": ["Invalid."]}
        )
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("expires_at must be in the future.", detail={"expires_at": ["In the past."]})
    prefix = secrets.token_hex(4)
    raw = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken(
        name=name,
        prefix=prefix,
        digest=token_digest(raw),
        scopes=granted,
        expires_at=expires_at,
        priority=priority,
        user=actor.user if service_account is None else None,
        service_account=service_account,
        tenant=tenant,
        created_by_name=actor.name,
    )
    with transaction.atomic():
        token.save()
        audit_record(
            actor=actor,
            action="token.created",
            target=token,
            tenant=token.tenant,
            after={
                "name": name,
                "prefix": prefix,
                "owner": token.owner_name,
                "scopes": granted,
                "tenant": tenant.slug if tenant else None,
                "expires_at": expires_at,
            },
        )
    return token, raw


def robot_tokens_permission(robot: ServiceAccount) -> tuple[str, int | None]:
    """What minting and revoking a service account's tokens needs: ``tokens:write`` in its tenant, or
    ``users:write`` platform-wide for a platform robot."""
    return (Scope.TOKENS_WRITE, robot.tenant_id) if robot.tenant_id else (Scope.USERS_WRITE, None)


def may_manage_token(actor: Principal, token: ApiToken) -> bool:
    if token.user_id is not None and actor.owns(token.user_id, token.tenant_id):
        return True
    if token.service_account is not None:
        return actor.may(*robot_tokens_permission(token.service_account))
    return actor.may(Scope.USERS_WRITE)


def token_revoke(*, actor: Principal, token: ApiToken) -> ApiToken:
    if not may_manage_token(actor, token):
        raise Forbidden("You may not revoke this token.")
    with transaction.atomic():
        now = timezone.now()
        if not ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now):
            raise Conflict("This token is already revoked.", code="already_revoked")
        token.revoked_at = now
        audit_record(
            actor=actor,
            action="token.revoked",
            target=token,
            tenant=token.tenant,
            before={"revoked_at": None},
            after={"revoked_at": now},
        )
    return token


def token_authenticate(raw: str) -> ApiToken:
    """The live token for a bearer secret. One indexed read; last_used_at is written at most once a minute."""
    if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        raise TokenRejected("Malformed token.")
    token = (
        ApiToken.objects.select_related("user", "service_account__tenant")
        .filter(digest=token_digest(raw))
        .first()
    )
    now = timezone.now()
    if token is None:
        raise TokenRejected("Unknown token.")
    if token.revoked_at is not None:
        raise TokenRejected("This token was revoked.")
    if token.expires_at is not None and token.expires_at <= now:
        raise TokenRejected("This token has expired.")
    owner = token.user or token.service_account
    owner_active = owner is not None and owner.is_active
    if not owner_active:
        raise TokenRejected("The token's owner is deactivated.")
    stale = now - timedelta(seconds=settings.TOKEN_LAST_USED_RESOLUTION_SECONDS)
    if token.last_used_at is None or token.last_used_at < stale:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
