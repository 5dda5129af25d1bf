"""Registering and changing models (the family a version belongs to)."""

from typing import Any

from django.db import transaction

from core.choices import Scope
from core.errors import Conflict, ValidationFailed
from core.models import Tenant
from core.principal import Principal
from core.services.audit import audit_record, snapshot
from core.services.revisions import reject_unknown, revised_update
from core.services.validation import full_clean
from registry.choices import Visibility
from registry.models import RegisteredModel
from registry.policy import parse_policy
from registry.services.access import require_on_model

MODEL_FIELDS = ("name", "visibility", "task", "description", "license", "labels", "validation_policy")
EDITABLE_MODEL_FIELDS = frozenset(MODEL_FIELDS) - {"name"}


def _check(model: RegisteredModel) -> None:
    if model.visibility == Visibility.CATALOG and model.owner_id is not None:
        raise ValidationFailed("Only platform-owned models can be in the catalog; tenant models are private.")
    if not isinstance(model.labels, dict) or not all(isinstance(v, str) for v in model.labels.values()):
        raise ValidationFailed("labels must be an object of strings.")
    parse_policy(model.validation_policy)
    full_clean(model)


def model_register(*, actor: Principal, owner: Tenant | None, name: str, **fields: Any) -> RegisteredModel:
    reject_unknown(fields, EDITABLE_MODEL_FIELDS, "Unknown model field(s)")
    model = RegisteredModel(owner=owner, name=name, **fields)
    require_on_model(actor, model, Scope.REGISTRY_WRITE)
    _check(model)
    with transaction.atomic():
        if RegisteredModel.objects.filter(owner=owner, name=name).exists():
            raise Conflict(f"Model {model.ref} already exists.", code="already_exists")
        model.save()
        audit_record(
            actor=actor,
            action="model.registered",
            target=model,
            tenant=owner,
            after=snapshot(model, MODEL_FIELDS),
        )
    return model


def model_update(
    *, actor: Principal, model: RegisteredModel, changes: dict[str, Any], expected_revision: int | None = None
) -> RegisteredModel:
    require_on_model(actor, model, Scope.REGISTRY_WRITE)
    reject_unknown(changes, EDITABLE_MODEL_FIELDS, "Field(s) that cannot be changed")
    return revised_update(
        actor=actor,
        instance=model,
        changes=changes,
        expected_revision=expected_revision,
        fields=MODEL_FIELDS,
        check=_check,
        action="model.updated",
        tenant_of=lambda m: m.owner,
    )
