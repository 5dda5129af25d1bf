"""People: creating users and setting their platform role."""

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction

from core.choices import PlatformRole, Scope
from core.errors import Conflict, Forbidden, ValidationFailed
from core.models import Tenant, User
from core.principal import Principal
from core.services.audit import audit_record
from core.services.tenants import tenant_user_create
from core.services.validation import full_clean


def user_create(
    *,
    actor: Principal,
    username: str,
    email: str = "",
    password: str | None = None,
    platform_role: str = "",
    tenant: Tenant | None = None,
    role: str = "",
) -> User:
    """A new person; with ``tenant`` (and ``role``), created by a tenant admin as a member of it."""
    if tenant is None:
        actor.require(Scope.USERS_WRITE)
    else:
        actor.require(Scope.MEMBERS_WRITE, tenant.pk)
        if platform_role:
            raise Forbidden("A user created for a tenant gets no platform role.")
    if platform_role not in PlatformRole.values:
        raise ValidationFailed(f"Unknown platform role '{platform_role}'.")
    user = User(username=username, email=email, platform_role=platform_role)
    full_clean(user, exclude=["password"])
    if password:
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise ValidationFailed("Password rejected: " + " ".join(exc.messages)) from exc
        user.set_password(password)
    else:
        user.set_unusable_password()
    with transaction.atomic():
        if User.objects.filter(username=username).exists():
            raise Conflict(f"User '{username}' already exists.", code="already_exists")
        user.save()
        audit_record(
            actor=actor,
            action="user.created",
            target=user,
            tenant=tenant,
            after={"username": username, "email": email, "platform_role": platform_role},
        )
        if tenant is not None:
            tenant_user_create(actor=actor, tenant=tenant, user=user, role=role)
    return user


def user_set_platform_role(*, actor: Principal, user: User, platform_role: str) -> User:
    actor.require(Scope.USERS_WRITE)
    if platform_role not in PlatformRole.values:
        raise ValidationFailed(f"Unknown platform role '{platform_role}'.")
    with transaction.atomic():
        before = User.objects.select_for_update().values_list("platform_role", flat=True).get(pk=user.pk)
        User.objects.filter(pk=user.pk).update(platform_role=platform_role)
        user.platform_role = platform_role
        audit_record(
            actor=actor,
            action="user.platform_role_set",
            target=user,
            before={"platform_role": before},
            after={"platform_role": platform_role},
        )
    return user
