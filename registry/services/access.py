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


def require_gate_override(actor: Principal, model: RegisteredModel) -> None:
    """Skipping a gate is for operators, and for the owner's tenant admins on their own models."""
    require_on_model(actor, model, Scope.REGISTRY_PROMOTE)
    if actor.sees_all(Scope.REGISTRY_PROMOTE):
        return
    if model.owner_id is not None and actor.tenant_roles.get(model.owner_id) == TenantRole.ADMIN:
        return
    raise Forbidden("Only operators (or the owner's tenant admins) may override a lifecycle gate.")
