"""Validation shared by the services: model constraints and domain codes, raised as ValidationFailed."""

from django.core.exceptions import ValidationError
from django.db import models

from core.choices import Jurisdiction
from core.errors import ValidationFailed


def full_clean(instance: models.Model, *, exclude: list[str] | None = None) -> None:
    """Run the model's field validators (lengths, slugs, choices) and report every failing field."""
    try:
        instance.full_clean(exclude=exclude, validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        fields = exc.message_dict
        summary = "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in fields.items())
        raise ValidationFailed(f"Invalid {instance._meta.verbose_name}: {summary}", detail=fields) from exc


def jurisdiction_codes(codes: object, *, field: str = "residency", allow_empty: bool = False) -> list[str]:
    """A de-duplicated, ordered list of known jurisdiction codes, or a message naming the bad ones."""
    if not isinstance(codes, list) or not all(isinstance(code, str) for code in codes):
        raise ValidationFailed(
            f"{field} must be a list of jurisdiction codes.", detail={field: ["Expected a list."]}
        )
    unknown = [code for code in codes if code not in Jurisdiction.values]
    if unknown:
        known = ", ".join(Jurisdiction.values)
        message = f"Unknown jurisdiction code(s) {', '.join(map(repr, unknown))}; use {known}."
        raise ValidationFailed(message, detail={field: [message]})
    if not codes and not allow_empty:
        raise ValidationFailed(f"{field} needs at least one jurisdiction.", detail={field: ["Required."]})
    return list(dict.fromkeys(codes))
