"""The level-triggered reconciler: make every region match the database, one (deployment, region) at a time.

Each pass reads the desired state from the database and what the region's driver reports, acts to close
the gap, and records the outcome. It is safe to run anywhere, any number of times, and to kill midway:
targets are claimed with a short lease by conditional UPDATE, names are deterministic, no transaction is
held across a driver call, and a target that errors is retried with exponential backoff without holding
up the others. Status changes are audited once, when they happen.
"""

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

from django.db import close_old_connections, transaction
from django.db.models import Q
from django.utils import timezone

from core.bulk import update_rows
from core.choices import AuditSource
from core.principal import Principal
from core.services.audit import AuditEntry, audit_record, audit_record_many
from regions import hooks
from regions.choices import DeploymentState, TargetRole, TargetStatus
from regions.drivers.base import DriverError, ObservedWorkload, Survey, WorkloadDriver, WorkloadSpec
from regions.drivers.factory import driver_for
from regions.models import Deployment, DeploymentEvent, DeploymentTarget, Region
from regions.workloads import SpecInputs, removed, spec_inputs, target_workload, workload_spec
from registry.models import ModelAlias

log = logging.getLogger(__name__)
LEASE = timedelta(seconds=120)
RESYNC = timedelta(seconds=20)
# A starting engine is looked at again this soon: a request held at a gateway waits for it (scale from
# zero). A look is one /health call on a host, or a Deployment and its pods read from a cluster (a few
# requests a second per starting workload, as `kubectl rollout status` makes). Degraded targets wait
# RECHECK.
STARTING_RECHECK = timedelta(seconds=0.25)
RECHECK = timedelta(seconds=3)
STARTING = (TargetStatus.PENDING, TargetStatus.PROVISIONING)
SETTLED = (TargetStatus.READY, TargetStatus.PAUSED)
MAX_BACKOFF_SECONDS = 300
# Outcomes recorded together: one transaction, one acquisition of the audit chain's lock, one republish.
RECORD_BATCH = 100
# A follow-up pass due for at least 1/SURVEY_SHARE of the region's targets surveys it (three listings)
# instead of looking at each (two requests apiece).
SURVEY_SHARE = 10
TELL_EVERY = timedelta(seconds=1)
SYSTEM = Principal.system("reconciler", source=AuditSource.TASK)


@dataclass(frozen=True)
class Outcome:
    status: str
    ready: int = 0
    endpoints: tuple[str, ...] = ()
    error: str = ""
    applied_hash: str = ""
    cold_starts: tuple[dict[str, float], ...] = ()
    allocated: int = 0  # replicas holding GPUs (scheduled, ready or not): what capacity is billed on


@dataclass(frozen=True)
class Pending:
    """What to record of one reconcile: the target's status and fields."""

    target: DeploymentTarget
    status: str
    fields: dict[str, object]
    error: str
    gpus: int | None = None  # the GPUs its replicas hold, when the region answered


def due_targets(region: Region, unsettled_only: bool = False) -> dict[int, str]:
    """The targets due for a reconcile and not leased by another reconciler: id → status, oldest due first."""
    now = timezone.now()
    due = (
        DeploymentTarget.objects.filter(region=region, next_attempt_at__lte=now)
        .exclude(status=TargetStatus.DELETED)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
    )
    if unsettled_only:
        due = due.exclude(status__in=SETTLED)
    return dict(due.order_by("next_attempt_at").values_list("pk", "status"))


def reconcile_region(region_id: int, unsettled_only: bool = False) -> int:
    """Reconcile the region's due targets that need it, at most ``reconcile_concurrency`` at a time. A ready
    target whose workload the region's survey shows exactly as recorded needs nothing: it is neither claimed
    nor written (a pass over a converged fleet writes nothing, to the database or the cluster). A follow-up
    pass for starting engines (``unsettled_only``) leaves the ready and paused ones to the periodic pass.
    Returns how many were reconciled."""
    region = Region.objects.get(pk=region_id)
    due = due_targets(region, unsettled_only)
    if not due:
        return 0
    driver = driver_for(region)
    survey = _survey(driver, region, due, unsettled_only)
    unchanged = _unchanged(survey, due) if survey else set()
    acting = [target_id for target_id in due if target_id not in unchanged]
    with ThreadPoolExecutor(max_workers=region.reconcile_concurrency) as pool:
        for start in range(0, len(acting), RECORD_BATCH):
            claimed = _claim(acting[start : start + RECORD_BATCH])
            work = partial(_work_in_thread, driver=driver, inputs=spec_inputs(claimed), survey=survey)
            _save_all([pending for pending in pool.map(work, claimed) if pending])
    TELLING.flush()
    return len(acting)


def _survey(
    driver: WorkloadDriver, region: Region, due: dict[int, str], unsettled_only: bool
) -> Survey | None:
    """The region's workloads from a few listings, with their pods when engines are starting among the
    due targets. A follow-up pass (four times a second while engines start) surveys only when it is due
    for a tenth of the region's targets or more: for a few, a look at each costs less than listing the
    whole region."""
    if unsettled_only and len(due) * SURVEY_SHARE < max(
        SURVEY_SHARE,
        DeploymentTarget.objects.filter(region=region).exclude(status=TargetStatus.DELETED).count(),
    ):
        return None
    starting = unsettled_only or any(status not in SETTLED for status in due.values())
    try:
        return driver.survey(starting)
    except DriverError as exc:
        log.warning("survey failed, every due target is observed by itself: %s", exc.message)
        return None


def _unchanged(survey: Survey, due: dict[int, str]) -> set[int]:
    """The due ready targets whose workload the driver's survey shows exactly as the target records it, for
    the spec it should run now, with no alias to follow: compare first, claim only what needs action."""
    ready = list(
        DeploymentTarget.objects.filter(
            pk__in=list(due), status=TargetStatus.READY, attempts=0, last_error=""
        )
        .exclude(role=TargetRole.RETIRING)
        .select_related("deployment__owner", "region")
        # Thousands of targets share a few models and versions (large JSON columns): read each once.
        .prefetch_related("deployment__model", "deployment__version", "version")
    )
    inputs = spec_inputs(ready)
    moved = _alias_moved(ready)
    return {
        target.pk
        for target in ready
        if target.deployment_id not in moved
        and _as_recorded(target, workload_spec(target, inputs), survey.settled.get(target_workload(target)))
    }


def _as_recorded(target: DeploymentTarget, spec: WorkloadSpec, seen: ObservedWorkload | None) -> bool:
    """What ``_converge`` would find, act on and record is what the target already says: nothing to do."""
    return (
        seen is not None
        and not spec.delegated
        and not removed(target)
        and target.observed_generation == target.deployment.generation
        and target.applied_hash == spec.spec_hash == seen.spec_hash
        and seen.replicas == seen.ready_replicas == spec.replicas == target.ready_replicas > 0
        and seen.endpoints == target.endpoints
    )


def _alias_moved(targets: list[DeploymentTarget]) -> set[int]:
    """Deployments among the targets' that follow an alias now pointing at another version (one query)."""
    following = {t.deployment for t in targets if t.role == TargetRole.STABLE and t.deployment.follow_alias}
    if not following:
        return set()
    points = {
        (alias.model_id, alias.name): alias.version_id
        for alias in ModelAlias.objects.filter(
            model_id__in={d.model_id for d in following}, name__in={d.follow_alias for d in following}
        )
    }
    return {d.pk for d in following if _points_elsewhere(d, points.get((d.model_id, d.follow_alias)))}


def _points_elsewhere(deployment: Deployment, alias_version_id: int | None) -> bool:
    """Whether the alias a deployment follows names a version other than the one it runs."""
    return alias_version_id is not None and alias_version_id != deployment.version_id


def _work_in_thread(
    target: DeploymentTarget, driver: WorkloadDriver, inputs: SpecInputs, survey: Survey | None
) -> Pending | None:
    try:
        return _work(target, driver, inputs, survey)
    except Exception:  # one item's failure never blocks the others
        log.exception("reconcile of target %s failed unexpectedly", target.pk)
        return None
    finally:
        close_old_connections()


def _claim(target_ids: list[int]) -> list[DeploymentTarget]:
    """Lease the targets no other reconciler holds (a conditional UPDATE), and read them with what a
    reconcile reads of them."""
    now = timezone.now()
    with transaction.atomic():
        free = list(
            DeploymentTarget.objects.select_for_update(skip_locked=True)
            .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now), pk__in=target_ids)
            .values_list("pk", flat=True)
        )
        DeploymentTarget.objects.filter(pk__in=free).update(lease_until=now + LEASE)
    return list(
        DeploymentTarget.objects.filter(pk__in=free)
        # Many targets share a few regions, owners, models and versions (wide rows, JSON columns): read
        # each once, not once per target as a join would.
        .prefetch_related(
            "region", "deployment__owner", "deployment__model", "deployment__version", "version"
        )
        .order_by("pk")
    )


def reconcile_target(target_id: int) -> None:
    """Reconcile one target now and record the outcome."""
    claimed = _claim([target_id])
    if claimed:
        target = claimed[0]
        _save_all([_work(target, driver_for(target.region), spec_inputs(claimed))])
        TELLING.flush()


def _work(
    target: DeploymentTarget,
    driver: WorkloadDriver,
    inputs: SpecInputs,
    survey: Survey | None = None,
) -> Pending:
    """Act on the claimed target's region and say what to record (the caller records a batch together).
    ``survey``: the region's, taken at the start of the pass (None: look at the workload itself)."""
    try:
        outcome = _converge(target, driver, inputs, survey)
    except DriverError as exc:
        return _failed(target, exc)
    return _succeeded(target, outcome)


def _follow_alias(target: DeploymentTarget) -> bool:
    """A deployment that follows an alias rolls to wherever the alias points now, all at once, unless a
    hook vetoes it (a rollout moves it instead, region by region, or rolled that version back here)."""
    deployment = target.deployment
    if not deployment.follow_alias or deployment.state != DeploymentState.ACTIVE:
        return False
    alias = deployment.model.aliases.filter(name=deployment.follow_alias).select_related("version").first()
    if alias is None or alias.version is None or not _points_elsewhere(deployment, alias.version_id):
        return False
    if hooks.alias_follow_veto(deployment, alias.version):
        return False
    with transaction.atomic():
        moved = Deployment.objects.filter(pk=deployment.pk, version=deployment.version).update(
            version=alias.version, generation=deployment.generation + 1, updated_at=timezone.now()
        )
        if moved:
            DeploymentEvent.objects.create(
                deployment=deployment,
                kind="rollout",
                message=f"alias {alias.name} moved: {deployment.version.version} → {alias.version.version}",
            )
            audit_record(
                actor=SYSTEM,
                action="deployment.rolled",
                target=deployment,
                tenant=deployment.owner,
                before={"version": deployment.version.version},
                after={"version": alias.version.version},
            )
    target.deployment.refresh_from_db()
    return True


def _converge(
    target: DeploymentTarget, driver: WorkloadDriver, inputs: SpecInputs, survey: Survey | None
) -> Outcome:
    if removed(target):
        driver.delete(target_workload(target))
        gone = driver.observe(target_workload(target)) is None
        return Outcome(TargetStatus.DELETED if gone else TargetStatus.DELETING)
    if target.role == TargetRole.STABLE and _follow_alias(target):
        inputs = spec_inputs([target])  # a new version: perhaps another GPU pool or scaler
    spec = workload_spec(target, inputs)
    waiting = _weights_missing(target, spec)
    if waiting is not None:
        return waiting
    observed = _look(driver, spec.name, survey)
    if _differs(observed, spec):
        _note_drift(target, observed, spec)
        created = observed is None and survey is not None  # the listing had none: nothing to read first
        driver.apply(spec, absent=created)
        if created:  # it is starting: the next pass's survey (a follow-up comes soon) sees it come up
            return _outcome(target, spec, None)
        observed = driver.observe(spec.name)
    return _outcome(target, spec, observed)


def _look(driver: WorkloadDriver, name: str, survey: Survey | None) -> ObservedWorkload | None:
    """The workload as it is now: from the pass's survey when it observed it or did not list it at all,
    else by looking at it."""
    if survey is not None and name in survey.observed:
        return survey.observed[name]
    if survey is not None and name not in survey.present:
        return None
    return driver.observe(name)


def _weights_missing(target: DeploymentTarget, spec: WorkloadSpec) -> Outcome | None:
    """In a region with its own object store, engines start only from a verified copy of the weights there;
    the artifacts app answers (regions.hooks), and without it such a region waits rather than guess. A
    delegated workload may be started by its in-cluster scaler whatever our count says."""
    if not target.region.object_store or (spec.replicas == 0 and not spec.delegated):
        return None
    provider = hooks.weights_provider()
    if provider is None:
        return Outcome(TargetStatus.WAITING, error=f"waiting for artifacts: {hooks.NO_WEIGHTS_PROVIDER}")
    wait = provider.gate(target)
    if wait is None:
        return None
    return Outcome(TargetStatus.FAILED if wait.permanent else TargetStatus.WAITING, error=wait.message)


def _differs(observed: ObservedWorkload | None, spec: WorkloadSpec) -> bool:
    if observed is None:
        return spec.replicas > 0 or spec.delegated
    return observed.spec_hash != spec.spec_hash or _rescaled(observed, spec) or observed.needs_repair


def _rescaled(observed: ObservedWorkload, spec: WorkloadSpec) -> bool:
    """Replicas other than ours; never of a delegated workload, whose count its in-cluster scaler owns."""
    return not spec.delegated and observed.replicas != spec.replicas


def _wanted(spec: WorkloadSpec, observed: ObservedWorkload) -> int:
    """The replicas a workload should have: ours, or, delegated, what its in-cluster scaler chose."""
    return observed.replicas if spec.delegated else spec.replicas


def _note_drift(target: DeploymentTarget, observed: ObservedWorkload | None, spec: WorkloadSpec) -> None:
    """When nothing changed on our side since the last convergence, a difference was made by someone else."""
    converged = (
        target.observed_generation == target.deployment.generation and target.applied_hash == spec.spec_hash
    )
    if not converged or target.status in (TargetStatus.PENDING, TargetStatus.DELETED):
        return
    crashed = False
    if observed is None:
        what = "the workload was deleted outside the control plane"
    elif _rescaled(observed, spec):
        what = (
            f"replicas were changed to {observed.replicas} outside the control plane (want {spec.replicas})"
        )
    elif observed.spec_hash != spec.spec_hash:
        what = "the workload was modified outside the control plane"
    else:
        crashed = True
        what = "engine replica(s) died" + (
            f": {observed.problem.splitlines()[0]}" if observed.problem else ""
        )
    with transaction.atomic():
        DeploymentEvent.objects.create(
            deployment=target.deployment, region=target.region, kind="drift", message=f"{what}; restoring"
        )
        if not crashed:  # a crash is an event; a change someone else made is audited too
            audit_record(
                actor=SYSTEM,
                action="deployment.drift_corrected",
                target=target.deployment,
                tenant=target.deployment.owner,
                message=f"{target.region.code}: {what}",
            )


def _outcome(target: DeploymentTarget, spec: WorkloadSpec, observed: ObservedWorkload | None) -> Outcome:
    if spec.replicas == 0 and not spec.delegated:
        return Outcome(TargetStatus.PAUSED, applied_hash=spec.spec_hash)
    if observed is None:
        return Outcome(TargetStatus.PROVISIONING, applied_hash=spec.spec_hash)
    common = {
        "ready": observed.ready_replicas,
        "endpoints": tuple(observed.endpoints),
        "applied_hash": spec.spec_hash,
        "cold_starts": tuple(observed.cold_starts),
        "allocated": observed.replicas,
    }
    if observed.problem_is_permanent:
        return Outcome(TargetStatus.FAILED, error=observed.problem, **common)  # type: ignore[arg-type]
    wanted = _wanted(spec, observed)
    if wanted == 0:  # a delegated workload its scaler took to zero (KEDA, idle)
        return Outcome(TargetStatus.PAUSED, **common)  # type: ignore[arg-type]
    # Engines that answer but are not reachable yet (no external address reported) serve nobody.
    serving = observed.ready_replicas if observed.endpoints else 0
    if serving >= wanted:
        return Outcome(TargetStatus.READY, **common)  # type: ignore[arg-type]
    was_up = target.status in (TargetStatus.READY, TargetStatus.DEGRADED)
    status = TargetStatus.DEGRADED if serving > 0 or was_up else TargetStatus.PROVISIONING
    return Outcome(status, error=observed.problem, **common)  # type: ignore[arg-type]


def _succeeded(target: DeploymentTarget, outcome: Outcome) -> Pending:
    settled = outcome.status in (TargetStatus.READY, TargetStatus.PAUSED, TargetStatus.FAILED)
    fields = {
        "ready_replicas": outcome.ready,
        "endpoints": list(outcome.endpoints),
        "cold_starts": list(outcome.cold_starts),
        "last_error": outcome.error,
        "attempts": 0,
        "lease_until": None,
        "applied_hash": outcome.applied_hash or target.applied_hash,
        "observed_generation": target.deployment.generation,
        "next_attempt_at": timezone.now() + _recheck(outcome.status, settled),
    }
    gpus = outcome.allocated * target.deployment.gpu_count
    return Pending(target, outcome.status, fields, outcome.error, gpus)


def _recheck(status: str, settled: bool) -> timedelta:
    if settled:
        return RESYNC
    return STARTING_RECHECK if status in STARTING else RECHECK


def starting_due_in(region_id: int) -> float | None:
    """Seconds until the region's next starting target is due (None: none is starting), so the task can
    come back for it instead of leaving it to the periodic pass."""
    due = (
        DeploymentTarget.objects.filter(region_id=region_id, status__in=STARTING)
        .order_by("next_attempt_at")
        .values_list("next_attempt_at", flat=True)
        .first()
    )
    return None if due is None else max(0.0, (due - timezone.now()).total_seconds())


def _failed(target: DeploymentTarget, exc: DriverError) -> Pending:
    attempts = target.attempts + 1
    delay = min(MAX_BACKOFF_SECONDS, 2**attempts) * random.uniform(0.8, 1.2)
    status = TargetStatus.FAILED if exc.permanent else target.status
    fields = {
        "last_error": exc.message,
        "attempts": attempts,
        "lease_until": None,
        "next_attempt_at": timezone.now() + timedelta(seconds=delay),
    }
    log.warning("reconcile %s failed (attempt %s, retry in %.0fs): %s", target, attempts, delay, exc.message)
    return Pending(target, status, fields, exc.message)


def _save_all(batch: list[Pending]) -> None:
    """Write a batch of outcomes in one transaction. A status change is a compare-and-set, evented and
    audited exactly once; the batch's audit events are appended under one acquisition of the chain's lock
    and its listeners are told once, after the commit."""
    if not batch:
        return
    changes: list[hooks.StatusChange] = []
    with transaction.atomic():
        now = timezone.now()
        current = _lock(batch)
        writes = []
        for pending in batch:
            target, fields = pending.target, pending.fields
            if pending.status != target.status:
                if current.get(target.pk) != target.status:
                    continue  # another writer changed the status since the claim: its change stands
                changes.append(hooks.StatusChange(target, target.status, pending.status))
                fields = {**fields, "status": pending.status, "last_transition_at": now}
                if pending.status == TargetStatus.READY:
                    fields["wakes_on_request"] = False  # woken and serving: no longer held for
            writes.append((target.pk, fields))
        update_rows(DeploymentTarget, writes)
        errors = {p.target.pk: p.error for p in batch}
        DeploymentEvent.objects.bulk_create([_evented(c, errors[c.target.pk]) for c in changes])
        audit_record_many([_audited(c, errors[c.target.pk]) for c in changes])
        for deployment in {c.target.deployment for c in changes if c.after == TargetStatus.DELETED}:
            _finish_deletion(deployment)
    if changes:
        transaction.on_commit(partial(TELLING.add, changes))
    allocations = [(p.target, p.gpus) for p in batch if p.gpus is not None]
    for listener in hooks.ALLOCATION_LISTENERS:
        listener(allocations)


def _lock(batch: list[Pending]) -> dict[int, str]:
    """Lock the batch's rows (in one order, as every writer does) and read their statuses: a status change
    is recorded only over the status it was decided from (compare-and-set)."""
    rows = DeploymentTarget.objects.select_for_update().filter(pk__in=[p.target.pk for p in batch])
    return dict(rows.order_by("pk").values_list("pk", "status"))


def _evented(change: hooks.StatusChange, error: str) -> DeploymentEvent:
    target = change.target
    message = f"{target.region.code}: {change.before} → {change.after}" + (
        f" ({error.splitlines()[0]})" if error else ""
    )
    return DeploymentEvent(deployment=target.deployment, region=target.region, kind="status", message=message)


def _audited(change: hooks.StatusChange, error: str) -> AuditEntry:
    target = change.target
    return AuditEntry(
        actor=SYSTEM,
        action="deployment.status_changed",
        target=target.deployment,
        tenant=target.deployment.owner,
        before={"region": target.region.code, "status": change.before},
        after={"region": target.region.code, "status": change.after, "error": error[:500]},
    )


class Telling:
    """Status changes are told to the listeners at once when none were told for a while (a request held
    for a woken deployment waits for the route table they publish), else at most once every TELL_EVERY,
    or ten times as long as the listeners took last, for the whole process (each telling republishes a
    table computed over the whole fleet: once per batch of every region's pass, bringing thousands of
    targets up would cost the square of the fleet); a pass ``flush``es what is held when it ends."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.telling = threading.Lock()
        self.held: list[hooks.StatusChange] = []
        self.told_at: float | None = None
        self.every = TELL_EVERY.total_seconds()

    def add(self, changes: list[hooks.StatusChange]) -> None:
        with self.lock:
            self.held += changes
            due = self.told_at is None or self.clock() - self.told_at >= self.every
        if due:
            self.flush(wait=False)

    def flush(self, wait: bool = True) -> None:
        """Tell what is held. One telling at a time: without ``wait``, while another runs, what is held
        goes with the next one."""
        if not self.telling.acquire(blocking=wait):
            return
        try:
            with self.lock:
                changes, self.held = self.held, []
            if not changes:
                return
            started = self.clock()
            for listener in hooks.STATUS_LISTENERS:
                listener(changes)
            with self.lock:
                self.told_at = self.clock()
                # Listeners slow at fleet size (a table over 5,000 targets) take at most a tenth of the time.
                self.every = max(TELL_EVERY.total_seconds(), 10 * (self.told_at - started))
        finally:
            self.telling.release()


TELLING = Telling()


def _finish_deletion(deployment: Deployment) -> None:
    if not deployment.targets.exclude(status=TargetStatus.DELETED).exists():
        Deployment.objects.filter(pk=deployment.pk, state=DeploymentState.DELETING).update(
            state=DeploymentState.DELETED, updated_at=timezone.now()
        )


def region_ids() -> list[int]:
    """Every region, for the periodic pass (a disabled region is reconciled down to zero)."""
    return list(Region.objects.values_list("pk", flat=True))
