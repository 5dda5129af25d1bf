"""What people (and CI) do with rollouts: start one, pause, resume, abort, promote by hand. One code path
for the API, the console and tests; the moves themselves are in ``rollouts.services.machine``, reads in
``rollouts.selectors``.
"""

from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from core.choices import Scope
from core.errors import Conflict, InvalidTransition, NotFound, ValidationFailed
from core.principal import Principal
from core.residency import residency_of, residency_refusal, weights_of
from core.services.audit import audit_record
from regions.choices import DeploymentState, TargetRole, TargetStatus
from regions.models import Deployment, Region
from regions.selectors import deployments_for, gpus_in_use
from regions.services.placement import check_quota, check_version_deployable
from registry import selectors as registry_selectors
from registry.choices import VersionStatus
from registry.models import ModelVersion, RegisteredModel
from registry.services.access import may_promote
from registry.services.lifecycle import version_transition
from rollouts import plan, tasks
from rollouts.analysis import DEFAULT_SPEC, PROMETHEUS, AnalysisSpec, parse_spec
from rollouts.choices import ACTIVE_STATES, OnFailure, RolloutState, Strategy, Verdict
from rollouts.models import AnalysisRun, Rollout
from rollouts.services.machine import candidate_targets, event, promote, rollback, rollout_transition

R = RolloutState
MAX_ROLLBACK_WINDOW = 7 * 24 * 3600
MAX_PROGRESS_DEADLINE = 24 * 3600


# --- start ------------------------------------------------------------------------------------------
def rollout_start(
    *,
    actor: Principal,
    deployment: Deployment,
    version: str,
    strategy: str = Strategy.CANARY,
    steps: Any = None,
    analysis: Any = None,
    waves: Any = None,
    alias: str = "",
    on_failure: str = OnFailure.STAGED,
    rollback_window_seconds: int = 300,
    progress_deadline_seconds: int = 900,
    webhook: str = "",
    now: datetime | None = None,
) -> Rollout:
    """Check everything, write the rollout (pending) and let the controller take it from there."""
    actor.require(Scope.DEPLOYMENTS_WRITE, deployment.owner_id)
    now = now or timezone.now()
    deployment = Deployment.objects.select_related("owner", "model", "version").get(pk=deployment.pk)
    if deployment.state != DeploymentState.ACTIVE:
        raise Conflict(f"{deployment} is {deployment.state}.", code="not_active")
    candidate = registry_selectors.version_get(deployment.model, version)
    if candidate.pk == deployment.version_id:
        raise Conflict(f"{deployment} already runs {candidate}.", code="already_running")
    checked = _checked_plan(deployment, strategy, steps, analysis, waves, on_failure)
    _check_window(rollback_window_seconds, progress_deadline_seconds)
    promotes = may_promote(actor, deployment.model)
    if not (candidate.status == VersionStatus.STAGED and promotes):
        check_version_deployable(actor, candidate)
    regions = [code for wave in checked["waves"] for code in wave]
    _check_regions(deployment, candidate, regions)
    # A full-size candidate beside the baseline in every region counts against the tenant's GPU quota.
    check_quota(deployment.owner, deployment.replicas * deployment.gpu_count * len(regions))
    if alias:
        registry_selectors.alias_get(deployment.model, alias)  # 404 for an alias the model lacks
    rollout = Rollout(
        owner=deployment.owner,
        deployment=deployment,
        candidate=candidate,
        baseline=deployment.version,
        strategy=strategy,
        alias=alias,
        rollback_window_seconds=rollback_window_seconds,
        progress_deadline_seconds=progress_deadline_seconds,
        promotes_version=promotes,
        created_by_name=actor.name,
        created_at=now,
        updated_at=now,
        **checked,
    )
    try:
        with transaction.atomic():
            return _save_start(actor, rollout, webhook)
    except IntegrityError as exc:
        raise Conflict(f"{deployment} already has a rollout in progress.", code="rollout_active") from exc


def rollout_start_for_alias(
    *, actor: Principal, model: RegisteredModel, follow_alias: str, **options: Any
) -> list[Rollout]:
    """One rollout per active deployment of ``model`` that follows ``follow_alias`` and that ``actor`` may
    change; all or none (one refusal writes nothing)."""
    deployments = list(
        deployments_for(actor)
        .filter(model=model, follow_alias=follow_alias, state=DeploymentState.ACTIVE)
        .order_by("pk")
    )
    deployments = [d for d in deployments if actor.may(Scope.DEPLOYMENTS_WRITE, d.owner_id)]
    if not deployments:
        raise NotFound(f"No deployment you may change follows {model.ref}:{follow_alias}.")
    options.setdefault("alias", follow_alias)
    with transaction.atomic():
        return [rollout_start(actor=actor, deployment=d, **options) for d in deployments]


def _checked_plan(
    deployment: Deployment, strategy: str, steps: Any, analysis: Any, waves: Any, on_failure: str
) -> dict[str, Any]:
    if on_failure not in OnFailure.values:
        raise ValidationFailed(
            f"on_failure must be one of {', '.join(OnFailure.values)}.", detail={"on_failure": ["Invalid."]}
        )
    regions = list(
        deployment.targets.filter(role=TargetRole.STABLE)
        .exclude(status=TargetStatus.DELETED)
        .order_by("pk")
        .values_list("region__code", flat=True)
    )
    try:
        checked_steps = plan.parse_steps(steps, strategy)
        checked_waves = plan.parse_waves(waves, regions)
    except plan.PlanError as exc:
        raise ValidationFailed(exc.message, detail={exc.field: [exc.message]}) from exc
    spec = _spec_for(analysis, [code for wave in checked_waves for code in wave])
    return {
        "steps": checked_steps,
        "waves": checked_waves,
        "analysis": spec.as_dict(),
        "on_failure": on_failure,
    }


def _spec_for(raw: Any, regions: list[str]) -> AnalysisSpec:
    """The analysis spec (a SpecError is a ValidationFailed naming each field). Where a wave's region has no
    Prometheus, the default spec judges by the gateway's records alone, and an explicit spec that reads
    Prometheus there is refused: it could never be judged, only paused."""
    spec = parse_spec(raw)
    blind = sorted(Region.objects.filter(code__in=regions, prometheus_url="").values_list("code", flat=True))
    reads_prometheus = any(m.source == PROMETHEUS for m in spec.metrics)
    if not blind or not reads_prometheus:
        return spec
    if spec == DEFAULT_SPEC:
        return replace(spec, metrics=tuple(m for m in spec.metrics if m.source != PROMETHEUS))
    raise ValidationFailed(
        f"{', '.join(blind)} has no Prometheus: judge it by gateway metrics only.",
        detail={
            "analysis.metrics": [f"prometheus metrics need a region's prometheus_url ({', '.join(blind)})"]
        },
    )


def _check_window(rollback_window: Any, deadline: Any) -> None:
    for name, value, high in (
        ("rollback_window_seconds", rollback_window, MAX_ROLLBACK_WINDOW),
        ("progress_deadline_seconds", deadline, MAX_PROGRESS_DEADLINE),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise ValidationFailed(f"{name} must be 0 to {high}.", detail={name: ["Out of range."]})


def _check_regions(deployment: Deployment, candidate: ModelVersion, codes: list[str]) -> None:
    """Every wave's region must be allowed to hold the candidate for this tenant, and have the GPUs for a
    full-size candidate beside the baseline: checked for all waves now, not found out in wave 2."""
    serving = residency_of(deployment.owner)
    need = deployment.replicas * deployment.gpu_count
    for region in Region.objects.filter(code__in=codes).prefetch_related("gpu_pools"):
        refusal = residency_refusal(weights_of(candidate), region.jurisdiction, serving=serving)
        if refusal is not None:
            raise ValidationFailed(
                f"{candidate} may not run in {region.code}: {refusal}.", detail={"waves": [refusal]}
            )
        pool = next((p for p in region.gpu_pools.all() if p.gpu_type == deployment.gpu_type), None)
        free = (pool.gpu_count if pool else 0) - gpus_in_use(region, deployment.gpu_type)
        if need > free:
            raise Conflict(
                f"{region.code} has {free} {deployment.gpu_type} GPUs free; a candidate beside the "
                f"baseline needs {need}.",
                code="no_capacity",
            )


def _save_start(actor: Principal, rollout: Rollout, webhook: str) -> Rollout:
    locked = Deployment.objects.select_for_update().get(pk=rollout.deployment_id)
    if locked.version_id != rollout.baseline_id or locked.state != DeploymentState.ACTIVE:
        raise Conflict(f"{locked} changed while the rollout was checked; try again.", code="rollout_active")
    if Rollout.objects.filter(deployment=rollout.deployment, state__in=ACTIVE_STATES).exists():
        raise Conflict(f"{rollout.deployment} already has a rollout in progress.", code="rollout_active")
    rollout.webhook = webhook
    rollout.save()
    candidate = rollout.candidate
    if candidate.status == VersionStatus.STAGED and rollout.promotes_version:
        version_transition(actor=actor, version=candidate, to=VersionStatus.CANARY, reason=str(rollout))
        Rollout.objects.filter(pk=rollout.pk).update(moved_to_canary=True)
        rollout.moved_to_canary = True
    waves = " → ".join("+".join(wave) for wave in rollout.waves)
    event(rollout, "started", f"{rollout.strategy} of {candidate} over {rollout.baseline}; waves {waves}")
    audit_record(
        actor=actor,
        action="rollout.started",
        target=rollout,
        tenant=rollout.owner,
        after={
            "deployment": str(rollout.deployment),
            "candidate": str(candidate),
            "baseline": str(rollout.baseline),
            "strategy": rollout.strategy,
            "steps": rollout.steps,
            "waves": rollout.waves,
        },
    )
    transaction.on_commit(partial(tasks.advance_rollout.delay, rollout.pk))
    return rollout


def _require(actor: Principal, rollout: Rollout) -> None:
    actor.require(Scope.DEPLOYMENTS_WRITE, rollout.owner_id)


def rollout_pause(*, actor: Principal, rollout: Rollout, reason: str = "") -> Rollout:
    _require(actor, rollout)
    with transaction.atomic():
        rollout_transition(rollout, R.PAUSED, reason=reason or f"paused by {actor.name}")
        event(rollout, "paused", rollout.reason)
        audit_record(
            actor=actor, action="rollout.paused", target=rollout, tenant=rollout.owner, message=reason
        )
    return rollout


def rollout_resume(*, actor: Principal, rollout: Rollout, now: datetime | None = None) -> Rollout:
    """Go on from a pause: an open pause (or an inconclusive step a person has looked at) counts as done."""
    _require(actor, rollout)
    now = now or timezone.now()
    if rollout.state != R.PAUSED:
        raise InvalidTransition(f"{rollout} is {rollout.state}; only a paused rollout resumes.")
    with transaction.atomic():
        step = rollout.step + 1 if _waits_for_a_person(rollout) else rollout.step
        rollout_transition(rollout, R.PROGRESSING, step=step, step_started_at=now)
        event(rollout, "resumed", f"resumed by {actor.name}")
        audit_record(actor=actor, action="rollout.resumed", target=rollout, tenant=rollout.owner)
        transaction.on_commit(partial(tasks.advance_rollout.delay, rollout.pk))
    return rollout


def _waits_for_a_person(rollout: Rollout) -> bool:
    """The step is an open pause, or its analysis was inconclusive: resuming passes it. Any other step
    (a person paused in the middle of a judged pause) starts over, so no analysis is skipped."""
    if rollout.step >= len(rollout.steps):
        return False
    pause = plan.pause_of(rollout.steps[rollout.step])
    if pause is None:
        return False
    unsure = AnalysisRun.objects.filter(
        rollout=rollout, wave=rollout.wave, step=rollout.step, verdict=Verdict.INCONCLUSIVE
    )
    return not pause.judged or unsure.exists()


def rollout_abort(*, actor: Principal, rollout: Rollout, reason: str) -> Rollout:
    _require(actor, rollout)
    if not reason.strip():
        raise ValidationFailed("An abort needs a reason.", detail={"reason": ["Required."]})
    return rollback(rollout, R.ABORTED, f"aborted by {actor.name}: {reason}", actor=actor)


def rollout_promote(*, actor: Principal, rollout: Rollout, reason: str) -> Rollout:
    """Skip what is left of the plan and promote now: a person's decision, audited as one."""
    _require(actor, rollout)
    if not reason.strip():
        raise ValidationFailed("Promoting by hand needs a reason.", detail={"reason": ["Required."]})
    ready = {t.region.code for t in candidate_targets(rollout) if t.status == TargetStatus.READY}
    missing = [code for wave in rollout.waves for code in wave if code not in ready]
    if missing:
        raise Conflict(
            f"The candidate is not ready in {', '.join(missing)}; it cannot take all traffic yet.",
            code="candidate_not_ready",
        )
    return promote(rollout, f"promoted by {actor.name}: {reason}", actor=actor, by_hand=True)
