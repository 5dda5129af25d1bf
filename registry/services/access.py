"""Who may change a model: its owner tenant's members by role, or the platform."""

from core.choices import Scope, TenantRole
from core.errors import Forbidden
from core.principal import Principal
from registry.models import RegisteredModel


def require_on_model(actor: Principal, model: RegisteredModel, scope: str) -> None:
    """Platform-owned models need the scope platform-wide; tenant models need it in the owner tenant."""
    actor.require(scope, model.owner_id)


def may_promote(actor: Principal, model: RegisteredModel) -> bool:
    """Whether ``actor`` may move the model's versions through the lifecycle (``require_on_model``'s rule)."""
    return actor.may(Scope.REGISTRY_PROMOTE, model.owner_id)


def may_override_gate(actor: Principal, model: RegisteredModel) -> bool:
    """Skipping a gate is for operators, and for the owner's tenant admins on their own models."""
    if not actor.may(Scope.REGISTRY_PROMOTE, model.owner_id):
        return False
    if actor.sees_all(Scope.REGISTRY_PROMOTE):
        return True
    return model.owner_id is not None and actor.tenant_roles.get(model.owner_id) == TenantRole.ADMIN


def require_gate_override(actor: Principal, model: RegisteredModel) -> None:
    require_on_model(actor, model, Scope.REGISTRY_PROMOTE)
    if not may_override_gate(actor, model):
        raise Forbidden("Only operators (or the owner's tenant admins) may override a lifecycle gate.")
