"""The version lifecycle: gated compare-and-set transitions, rollback, and the aliases that follow them."""

from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.choices import Scope
from core.errors import Conflict, InvalidTransition, ValidationFailed
from core.principal import Principal
from core.services.audit import audit_record
from core.services.validation import full_clean
from registry import selectors
from registry.choices import (
    ALIASABLE_STATES,
    BUILTIN_ALIASES,
    STATE_ALIASES,
    VERSION_TRANSITIONS,
    ReportOutcome,
    VersionStatus,
)
from registry.hooks import TRANSITION_LISTENERS, production_evidence, version_users
from registry.models import AliasMove, ModelAlias, ModelVersion, RegisteredModel, VersionTransition
from registry.services.access import require_gate_override, require_on_model

S = VersionStatus


def _gate(actor: Principal, version: ModelVersion, to: str, reason: str, override: bool) -> bool:
    """Check the gate into ``to``; returns whether an override was used."""
    if to == S.VALIDATED:
        report = selectors.latest_report(version)
        if report is None or report.outcome != ReportOutcome.PASSED:
            why = "no validation report" if report is None else "its latest validation report failed"
            raise Conflict(f"{version} cannot be validated: {why}.", code="gate_failed")
    if to == S.PRODUCTION:
        # A succeeded rollout (registry.hooks: the rollouts app vouches) opens the gate; without one,
        # only an operator's override with a reason does.
        if not override and production_evidence(version):
            return False
        if not override:
            raise Conflict(
                f"{version} needs a succeeded rollout before production; "
                "an operator may override with a reason.",
                code="gate_failed",
            )
        if not reason.strip():
            raise ValidationFailed("A gate override needs a reason.", detail={"reason": ["Required."]})
        require_gate_override(actor, version.model)
        return True
    if to == S.RETIRED and (users := version_users(version)):
        raise Conflict(
            f"{version} is still used by {', '.join(users)}.", code="in_use", detail={"users": users}
        )
    return False


def _move(actor: Principal, version: ModelVersion, to: str, reason: str, override: bool = False) -> None:
    """Compare-and-set the status and record the move; a lost race is an InvalidTransition (409)."""
    now = timezone.now()
    moved = ModelVersion.objects.filter(pk=version.pk, status=version.status).update(
        status=to, status_changed_at=now, updated_at=now
    )
    if not moved:
        current = ModelVersion.objects.values_list("status", flat=True).get(pk=version.pk)
        raise InvalidTransition(
            f"{version} is {current} now (someone moved it first); it cannot go to {to}.",
            detail={"current": current},
        )
    VersionTransition.objects.create(
        version=version,
        from_status=version.status,
        to_status=to,
        at=now,
        actor_name=actor.name,
        reason=reason,
        gate_override=override,
    )
    version.status, version.status_changed_at = to, now


def _point(
    actor: Principal, model: RegisteredModel, name: str, version: ModelVersion | None, reason: str
) -> None:
    alias, _ = ModelAlias.objects.select_for_update().get_or_create(model=model, name=name)
    if alias.version_id == (version.pk if version else None):
        return
    AliasMove.objects.create(
        alias=alias,
        version=version,
        previous_version_id=alias.version_id,
        actor_name=actor.name,
        reason=reason,
    )
    ModelAlias.objects.filter(pk=alias.pk).update(version=version, updated_at=timezone.now())


def _follow_aliases(actor: Principal, version: ModelVersion, left: str, reason: str) -> None:
    """Built-in aliases track their state: clear the alias of the state left, point the one entered."""
    model = version.model
    if (
        left in STATE_ALIASES
        and ModelAlias.objects.filter(model=model, name=STATE_ALIASES[left], version=version).exists()
    ):
        _point(actor, model, STATE_ALIASES[left], None, reason)
    if version.status in STATE_ALIASES:
        _point(actor, model, STATE_ALIASES[version.status], version, reason)


def version_transition(
    *, actor: Principal, version: ModelVersion, to: str, reason: str = "", override: bool = False
) -> ModelVersion:
    require_on_model(actor, version.model, Scope.REGISTRY_PROMOTE)
    if to not in VersionStatus.values:
        raise ValidationFailed(
            f"Unknown state '{to}'.", detail={"to": [f"Use one of {', '.join(S.values)}."]}
        )
    allowed = VERSION_TRANSITIONS[version.status]
    if to not in allowed:
        raise InvalidTransition(
            f"{version} is {version.status}; it can go to "
            f"{', '.join(sorted(allowed)) or 'nothing'}, not {to}.",
            detail={"current": version.status, "allowed": sorted(allowed)},
        )
    with transaction.atomic():
        used_override = _gate(actor, version, to, reason, override)
        left = version.status
        _move(actor, version, to, reason, used_override)
        _follow_aliases(actor, version, left, reason)
        demoted = _demote_previous_production(actor, version, reason) if to == S.PRODUCTION else []
        audit_record(
            actor=actor,
            action="model_version.transitioned",
            target=version,
            tenant=version.model.owner,
            before={"status": left},
            message=reason,
            after={"status": to, "gate_override": used_override, "demoted": demoted},
        )
        for listener in TRANSITION_LISTENERS:
            transaction.on_commit(partial(listener, version, to))
    return version


def _demote_previous_production(actor: Principal, promoted: ModelVersion, reason: str) -> list[str]:
    """One production version per model: the one it replaces becomes deprecated."""
    demoted = []
    others = promoted.model.versions.select_for_update().filter(status=S.PRODUCTION).exclude(pk=promoted.pk)
    for previous in others:
        _move(actor, previous, S.DEPRECATED, f"replaced by {promoted.version}: {reason}".strip(": "))
        demoted.append(previous.version)
    return demoted


def _rollback_target(model: RegisteredModel, current: ModelVersion) -> ModelVersion:
    last = (
        VersionTransition.objects.filter(
            version__model=model, to_status=S.PRODUCTION, version__status=S.DEPRECATED
        )
        .exclude(version=current)
        .select_related("version__model__owner")
        .order_by("-at", "-pk")
        .first()
    )
    if last is None:
        raise Conflict(
            f"{model.ref} has no earlier production version to roll back to.", code="no_rollback_target"
        )
    return last.version


def model_rollback(*, actor: Principal, model: RegisteredModel, reason: str) -> ModelVersion:
    """Production goes back to the previous production version; the current one drops back to staged."""
    require_gate_override(actor, model)
    if not reason.strip():
        raise ValidationFailed("A rollback needs a reason.", detail={"reason": ["Required."]})
    with transaction.atomic():
        current = model.versions.select_for_update().filter(status=S.PRODUCTION).first()
        if current is None:
            raise Conflict(f"{model.ref} has no production version to roll back.", code="no_production")
        target = _rollback_target(model, current)
        _move(actor, current, S.STAGED, f"rolled back: {reason}")
        _move(actor, target, S.PRODUCTION, f"rollback: {reason}", override=True)
        _point(actor, model, "production", target, f"rollback: {reason}")
        _point(actor, model, "staging", current, f"rollback: {reason}")
        audit_record(
            actor=actor,
            action="model.rolled_back",
            target=model,
            tenant=model.owner,
            message=reason,
            before={"production": current.version},
            after={"production": target.version, "staged": current.version},
        )
    return target


def alias_move(
    *, actor: Principal, model: RegisteredModel, name: str, version: ModelVersion | None, reason: str = ""
) -> ModelAlias:
    """Point a custom alias at a version (or at nothing); built-in aliases follow the lifecycle."""
    require_on_model(actor, model, Scope.REGISTRY_PROMOTE)
    if name in BUILTIN_ALIASES:
        raise Conflict(
            f"Alias '{name}' follows the lifecycle; promote a version instead.", code="builtin_alias"
        )
    alias = ModelAlias(model=model, name=name)
    if version is not None and version.status not in ALIASABLE_STATES:
        raise Conflict(
            f"{version} is {version.status}; aliases may point at "
            f"{', '.join(sorted(ALIASABLE_STATES))} versions.",
            code="not_aliasable",
        )
    full_clean(alias, exclude=["model", "version"])
    with transaction.atomic():
        previous = (
            ModelAlias.objects.filter(model=model, name=name)
            .values_list("version__version", flat=True)
            .first()
        )
        _point(actor, model, name, version, reason)
        alias = ModelAlias.objects.select_related("version").get(model=model, name=name)
        audit_record(
            actor=actor,
            action="model_alias.moved",
            target=alias,
            tenant=model.owner,
            message=reason,
            before={"version": previous},
            after={"version": version.version if version else None},
        )
    return alias


def transition_choices(version: ModelVersion) -> list[dict[str, Any]]:
    """The next states and what their gate needs, for the console's action buttons."""
    needs: dict[str, str] = {
        S.VALIDATED: "a passing validation report",
        S.PRODUCTION: "a succeeded rollout, or an operator override with a reason",
        S.RETIRED: "no deployment using it",
    }
    return [{"to": to, "needs": needs.get(to, "")} for to in sorted(VERSION_TRANSITIONS[version.status])]


def version_reject(*, actor: Principal, version: ModelVersion, reason: str) -> ModelVersion:
    """Reject a version that cannot be trusted (e.g. its weights do not match their checksum)."""
    if version.status not in (S.DRAFT, S.VALIDATING):
        raise InvalidTransition(
            f"{version} is {version.status}; only draft or validating versions are rejected."
        )
    with transaction.atomic():
        left = version.status
        _move(actor, version, S.REJECTED, reason)
        audit_record(
            actor=actor,
            action="model_version.rejected",
            target=version,
            tenant=version.model.owner,
            before={"status": left},
            after={"status": S.REJECTED},
            message=reason,
        )
    return version
