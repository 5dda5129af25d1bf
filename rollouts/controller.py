"""The rollout controller: level-triggered, one rollout at a time, safe to run anywhere and to kill midway.

Each pass reads where the rollout is (wave, step) and what the regions report, and does the one thing
due: start the wave's candidates, wait for them, set a weight, wait out a pause, judge it, go to the next
wave, promote, or roll back. Every move is a compare-and-set on (state, wave, step), so two workers never
take the same step twice, and a worker killed midway leaves the rollout where the database says; the next
pass (Celery beat, or the task enqueued on change) goes on from there. While the control plane is down
nothing moves: the gateways keep the weights of the last route table (safe), and nothing is promoted.
"""

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from billing.models import UsageRecord
from core.errors import InvalidTransition
from regions.choices import DeploymentState, TargetRole, TargetStatus
from regions.models import DeploymentTarget, Region
from registry.choices import SERVABLE_STATES, ReportOutcome
from registry.models import ModelVersion
from registry.selectors import latest_report
from rollouts import plan
from rollouts.analysis import FAILED, INCONCLUSIVE, parse_spec, verdict
from rollouts.choices import RolloutState, Strategy
from rollouts.metrics import Side, measure
from rollouts.models import AnalysisRun, Rollout
from rollouts.services.machine import (
    candidate_targets,
    ensure_candidates,
    event,
    judged_everywhere,
    promote,
    rollback,
    rollout_transition,
    set_weights,
)
from routing.choices import Health
from routing.models import EndpointHealth
from routing.services import publish

log = logging.getLogger(__name__)
R = RolloutState
DONE_WEIGHT = 100  # a finished canary or blue-green wave serves from the candidate while later waves run
# Gateways ship usage records every second or so: a window ending this long ago has all of its records.
USAGE_GRACE = timedelta(seconds=3)


def advance(rollout_id: int, now: datetime | None = None) -> str:
    """One pass over one rollout; returns its state afterwards. A move another pass (or a person) made
    first is no error: that move stands, and this pass ends."""
    try:
        return _advance(rollout_id, now or timezone.now())
    except InvalidTransition:
        return str(Rollout.objects.values_list("state", flat=True).get(pk=rollout_id))


def _advance(rollout_id: int, now: datetime) -> str:
    rollout = Rollout.objects.select_related("deployment", "candidate__model", "baseline").get(pk=rollout_id)
    if rollout.state not in (R.PENDING, R.PROGRESSING, R.PAUSED):
        return rollout.state
    if rollout.deployment.state != DeploymentState.ACTIVE:
        rollback(rollout, R.ABORTED, f"{rollout.deployment} is being deleted")
        return rollout.state
    if rollout.state == R.PENDING:
        _begin(rollout, now)
        return rollout.state
    trouble = _candidate_trouble(rollout, now)
    if trouble:
        rollback(rollout, R.FAILED, trouble)
        return rollout.state
    if rollout.state == R.PROGRESSING:
        _progress(rollout, now)
    return rollout.state


def _begin(rollout: Rollout, now: datetime) -> None:
    with transaction.atomic():
        rollout_transition(rollout, R.PROGRESSING, step_started_at=now, wave_started_at=now)
        event(rollout, "wave", f"wave 1: {', '.join(rollout.waves[0])}", at=now)
    ensure_candidates(rollout, rollout.waves[0])


def _wave_regions(rollout: Rollout) -> list[str]:
    return list(rollout.waves[rollout.wave])


def _candidate_trouble(rollout: Rollout, now: datetime) -> str:
    """Why the candidate cannot go on (failed, crash-looping, unhealthy in any wave so far, or not up in
    time in this one); '' when it can."""
    status = ModelVersion.objects.values_list("status", flat=True).get(pk=rollout.candidate_id)
    if status not in SERVABLE_STATES:
        return f"the candidate version is {status} now; it may not serve"
    started = rollout.wave_started_at or rollout.created_at
    current = set(_wave_regions(rollout))
    for target in candidate_targets(rollout):
        code = target.region.code
        if target.status == TargetStatus.FAILED:
            return f"the candidate failed in {code}: {target.last_error or 'the engine did not start'}"
        if target.status == TargetStatus.DEGRADED:
            return f"the candidate is degraded in {code} (replicas died): {target.last_error}".rstrip(": ")
        sick = EndpointHealth.objects.filter(url__in=target.endpoints, state=Health.UNHEALTHY).first()
        if sick is not None:
            return f"the candidate is unhealthy in {code}: {sick.url} {sick.last_error}".strip()
        late = now - started > timedelta(seconds=rollout.progress_deadline_seconds)
        if code in current and target.status != TargetStatus.READY and late:
            return f"the candidate was not ready in {code} within {rollout.progress_deadline_seconds} s"
    return ""


def _all_ready(rollout: Rollout) -> bool:
    regions = _wave_regions(rollout)
    targets = ensure_candidates(rollout, regions)
    return len(targets) == len(regions) and all(t.status == TargetStatus.READY for t in targets)


def _progress(rollout: Rollout, now: datetime) -> None:
    if not _all_ready(rollout):
        return
    if rollout.step >= len(rollout.steps):
        _finish_wave(rollout, now)
        return
    step = rollout.steps[rollout.step]
    if "set_weight" in step:
        _weigh(rollout, now, traffic=step["set_weight"])
    elif "set_mirror" in step:
        _weigh(rollout, now, mirror=step["set_mirror"])
    else:
        _pause(rollout, now, plan.pause_of(step))  # type: ignore[arg-type]


def _next_step(rollout: Rollout, now: datetime, **fields: Any) -> bool:
    """Compare-and-set the step forward: False when another pass took it first."""
    moved = Rollout.objects.filter(
        pk=rollout.pk, state=R.PROGRESSING, wave=rollout.wave, step=rollout.step
    ).update(step=rollout.step + 1, step_started_at=now, updated_at=now, **fields)
    if moved:
        rollout.step, rollout.step_started_at = rollout.step + 1, now
    return bool(moved)


def _weigh(rollout: Rollout, now: datetime, traffic: int | None = None, mirror: int | None = None) -> None:
    regions = _wave_regions(rollout)
    with transaction.atomic():
        if not _next_step(rollout, now):
            return
        set_weights(rollout, regions, traffic=traffic, mirror=mirror)
        what = f"candidate {traffic} %" if traffic is not None else f"mirror {mirror} %"
        event(rollout, "weight", f"{', '.join(regions)}: {what}", at=now)
    publish()


def _pause(rollout: Rollout, now: datetime, pause: plan.Pause) -> None:
    if not pause.judged:
        with transaction.atomic():
            rollout_transition(rollout, R.PAUSED, reason="waiting for a person to resume")
            event(rollout, "paused", "the plan pauses here until someone resumes it", at=now)
        return
    began = rollout.step_started_at or now
    if pause.seconds is not None and now < began + timedelta(seconds=pause.seconds):
        return
    opened = began + timedelta(seconds=pause.warmup_seconds)  # the window leaves the warm-up out
    sides = {code: _sides(rollout, code) for code in _wave_regions(rollout)}
    waited_long = now - began > timedelta(seconds=rollout.progress_deadline_seconds)
    if (
        pause.min_requests
        and not waited_long  # too little traffic for too long: the analysis says so, and a person decides
        and any(_too_few(rollout, code, *sides[code], opened, now, pause.min_requests) for code in sides)
    ):
        return
    if now - opened <= USAGE_GRACE:
        return
    _judge(rollout, now, opened, sides)


def _judge(rollout: Rollout, now: datetime, started: datetime, sides: dict[str, tuple[Side, Side]]) -> None:
    spec = parse_spec(rollout.analysis or None)
    verdicts = []
    for code, (candidate, baseline) in sides.items():
        region = Region.objects.get(code=code)
        measurements = measure(
            spec,
            deployment_id=rollout.deployment_id,
            region_code=code,
            prometheus_url=region.prometheus_url,
            candidate=candidate,
            baseline=baseline,
            start=started,
            end=now - USAGE_GRACE,
        )
        quality = _quality_gate(rollout) if spec.quality_gate else ""
        found = FAILED if quality else verdict(measurements)
        run, _ = AnalysisRun.objects.get_or_create(
            rollout=rollout,
            wave=rollout.wave,
            step=rollout.step,
            region=code,
            defaults={
                "window_start": started,
                "window_end": now - USAGE_GRACE,
                "verdict": found,
                "measurements": [m.as_dict() for m in measurements],
                "message": quality or _summary(measurements),
                "at": now,
            },
        )
        verdicts.append((code, run.verdict))  # a run another pass stored first is the one acted on
    _act_on(rollout, now, verdicts)


def _act_on(rollout: Rollout, now: datetime, verdicts: list[tuple[str, str]]) -> None:
    failed = [code for code, found in verdicts if found == FAILED]
    unsure = [code for code, found in verdicts if found == INCONCLUSIVE]
    where = f"wave {rollout.wave + 1} step {rollout.step + 1}"
    if failed:
        rollback(rollout, R.FAILED, f"analysis failed at {where} in {', '.join(failed)}")
    elif unsure:
        with transaction.atomic():
            reason = (
                f"analysis inconclusive at {where} in {', '.join(unsure)}: a person decides (resume or abort)"
            )
            rollout_transition(rollout, R.PAUSED, reason=reason)
            event(rollout, "inconclusive", reason, at=now)
    else:
        with transaction.atomic():
            if _next_step(rollout, now):
                event(rollout, "analysis", f"analysis successful at {where}", at=now)


def _finish_wave(rollout: Rollout, now: datetime) -> None:
    """The wave's plan is done: it takes all traffic (canary, blue-green) and the next wave starts, or,
    after the last wave, the candidate is promoted."""
    if rollout.wave + 1 >= len(rollout.waves):
        judged = "judged by analysis in every region" if judged_everywhere(rollout) else "no step was judged"
        promote(rollout, f"every wave's plan is done, {judged}")
        return
    regions = _wave_regions(rollout)
    with transaction.atomic():
        moved = Rollout.objects.filter(
            pk=rollout.pk, state=R.PROGRESSING, wave=rollout.wave, step=rollout.step
        ).update(wave=rollout.wave + 1, step=0, step_started_at=now, wave_started_at=now, updated_at=now)
        if not moved:
            return
        if rollout.strategy != Strategy.SHADOW:
            set_weights(rollout, regions, traffic=DONE_WEIGHT)
        rollout.wave, rollout.step, rollout.wave_started_at, rollout.step_started_at = (
            rollout.wave + 1,
            0,
            now,
            now,
        )
        event(rollout, "wave", f"wave {rollout.wave + 1}: {', '.join(_wave_regions(rollout))}", at=now)
    publish()
    ensure_candidates(rollout, _wave_regions(rollout))


def _sides(rollout: Rollout, code: str) -> tuple[Side, Side]:
    """Candidate and baseline in one region, as the gateway's records and Prometheus name them."""
    targets = DeploymentTarget.objects.filter(deployment=rollout.deployment, region__code=code)
    candidate = targets.filter(version=rollout.candidate, role=TargetRole.CANDIDATE).first()
    baseline = targets.filter(role=TargetRole.STABLE).first()
    model = rollout.candidate.model.name
    tracks = ("mirror",) if rollout.strategy == Strategy.SHADOW else ("candidate",)
    return (
        Side(f"{model}@{rollout.candidate.version}", tuple(candidate.endpoints if candidate else ()), tracks),
        Side(
            f"{model}@{rollout.baseline.version}", tuple(baseline.endpoints if baseline else ()), ("stable",)
        ),
    )


def _too_few(
    rollout: Rollout,
    code: str,
    candidate: Side,
    baseline: Side,
    since: datetime,
    until: datetime,
    wanted: int,
) -> bool:
    """Whether a side has served fewer than ``wanted`` requests in the region since the pause began. Both
    sides count: a step judged on one side's requests alone is no comparison (a baseline the gateway
    stopped sending to for a while, e.g. one it ejected as slow, made it inconclusive), so the pause waits
    for both, at most the progress deadline. A baseline that a canary at 100 % no longer feeds is not
    waited for."""
    sides = [candidate] if _candidate_takes_all(rollout, code) else [candidate, baseline]
    return any(_served(rollout, code, side, since, until) < wanted for side in sides)


def _candidate_takes_all(rollout: Rollout, code: str) -> bool:
    return DeploymentTarget.objects.filter(
        deployment=rollout.deployment, region__code=code, role=TargetRole.CANDIDATE, traffic_percent__gte=100
    ).exists()


def _served(rollout: Rollout, code: str, side: Side, since: datetime, until: datetime) -> int:
    return UsageRecord.objects.filter(
        deployment=rollout.deployment_id,
        region=code,
        version=side.version,
        track__in=side.tracks,
        started_at__gte=since,
        started_at__lt=until,
    ).count()


def _quality_gate(rollout: Rollout) -> str:
    """The registry's validation policy on the latest report CI posted for the candidate ('' passes)."""
    report = latest_report(rollout.candidate)
    if report is None:
        return "quality gate: no validation report for the candidate"
    if report.outcome != ReportOutcome.PASSED:
        return "quality gate: the candidate's latest validation report failed the model's policy"
    return ""


def _summary(measurements: list[Any]) -> str:
    return "; ".join(f"{m.metric} {m.stat}: {m.verdict}" for m in measurements)


def due_rollouts() -> list[int]:
    return list(
        Rollout.objects.filter(state__in=[R.PENDING, R.PROGRESSING, R.PAUSED]).values_list("pk", flat=True)
    )
