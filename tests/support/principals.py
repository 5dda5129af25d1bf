"""The people of the shared fixture world (``world`` in tests/conftest.py), and their credentials."""

from dataclasses import dataclass

from core.choices import ALL_SCOPES, AuditSource
from core.models import ServiceAccount, Tenant, User
from core.principal import Principal
from core.services.tokens import token_create


@dataclass
class World:
    tenant_a: Tenant
    tenant_b: Tenant
    alice: User  # admin of A
    dave: User  # developer of A
    vera: User  # viewer of A
    bob: User  # admin of B
    admin: User  # platform admin
    operator: User
    auditor: User
    robot_a: ServiceAccount
    robot_b: ServiceAccount


def principal(user: User) -> Principal:
    return Principal.for_user(user, source=AuditSource.API)


def system() -> Principal:
    return Principal.system("tests", source=AuditSource.COMMAND)


def mint(user: User, scopes: list[str] | None = None, **kwargs: object) -> str:
    """A bearer secret for a user, with all the scopes the user holds unless told otherwise."""
    p = principal(user)
    held = p.all_scopes & ALL_SCOPES
    if len(p.tenant_roles) != 1 and "tenant" not in kwargs:  # models:invoke needs a tenant binding
        held -= {"models:invoke"}
    _, secret = token_create(actor=p, name="test", scopes=scopes or sorted(held), **kwargs)
    return secret
