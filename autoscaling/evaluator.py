"""One autoscaler pass over the fleet: every enabled policy, every region, a handful of queries in all.

Reads (whatever the fleet's size): the policies, their stable targets, the scaler states, one aggregate
of recent requests, the GPUs in use per pool and per tenant, the prices, and per region its signals
(``signals``: a few PromQL queries, or one read of the probes). Decides per region (``algorithm``),
places each group's net change (``fleet``), and writes only what changed: a scale goes through regions'
``targets_scale`` (audited, logged as a decision, converged by the reconciler); a state row is written when
its recommendations, rate-limit memory or limits changed, or its once-a-minute timeline sample is due.
A deployment in a rollout is left alone (its replicas are the rollout's), and so is a region that
delegates to an in-cluster scaler.
"""

import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import F, Max, Sum

from autoscaling import algorithm, fleet, signals
from autoscaling.choices import DecisionKind
from autoscaling.kubernetes import delegated
from autoscaling.memory import Memory, states_of
from autoscaling.models import AutoscalingPolicy, ScalerState
from autoscaling.policy import Policy, effective, parse
from billing.models import UsageRecord
from billing.reports import prices_now
from billing.selectors import served_by_engines
from core.choices import AuditSource
from core.errors import ApplicationError
from core.models import Tenant
from core.principal import Principal
from core.residency import residency_of, residency_refusal, weights_of
from regions.choices import DeploymentState, TargetRole, TargetStatus
from regions.models import Deployment, DeploymentTarget, GpuPool, Region
from regions.selectors import LIVE_TARGETS
from regions.services import placement
from regions.services.deployments import targets_scale

log = logging.getLogger(__name__)
AUTOSCALER = Principal.system("autoscaler", source=AuditSource.TASK)


@dataclass
class Report:
    deployments: int = 0
    targets: int = 0
    scaled: list[str] = field(default_factory=list)  # "tenant/name: reason"
    limited: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # deployments whose evaluation raised (logged)
    sources: dict[str, str] = field(default_factory=dict)  # region code: where its signals came from


@dataclass
class Fleet:
    """What one pass read, shared by every deployment's decision."""

    now: datetime
    values: dict[int, signals.Values]
    last_request: dict[tuple[int, str], datetime]
    free_gpus: dict[tuple[int, str], int]  # (region id, GPU type): free
    tenant_room: dict[int, int | None]  # tenant id: GPUs its quota still allows (None: no quota)
    price: Any  # billing.reports.prices_now
    region_ids: dict[str, int]  # region code: id

    def took(self, deployment: Deployment, changed: dict[str, tuple[int, int]]) -> None:
        """Count a scale made in this pass, so the deployments after it see the GPUs it took or freed."""
        for code, (before, after) in changed.items():
            gpus = (after - before) * deployment.gpu_count
            pool = (self.region_ids[code], deployment.gpu_type)
            self.free_gpus[pool] = self.free_gpus.get(pool, 0) - gpus
            room = self.tenant_room.get(deployment.owner_id)
            if room is not None:
                self.tenant_room[deployment.owner_id] = room - gpus


def evaluate_all(*, now: datetime) -> Report:
    policies = list(
        AutoscalingPolicy.objects.filter(
            enabled=True, deployment__state=DeploymentState.ACTIVE
        ).select_related("deployment__owner", "deployment__version__model__owner")
    )
    in_rollout = set(
        DeploymentTarget.objects.filter(role=TargetRole.CANDIDATE)
        .exclude(status=TargetStatus.DELETED)
        .values_list("deployment_id", flat=True)
    )
    policies = [p for p in policies if p.deployment_id not in in_rollout]
    targets = _targets(policies)
    states = states_of(targets)
    report = Report(deployments=len(policies), targets=len(targets))
    data = Fleet(
        now=now,
        values=_values(targets, policies, report, now),
        last_request=_last_requests(policies, now),
        free_gpus=_free_gpus(),
        tenant_room=_tenant_room({p.deployment.owner_id for p in policies}),
        price=prices_now(now),
        region_ids=dict(Region.objects.values_list("code", "pk")),
    )
    by_deployment: dict[int, list[DeploymentTarget]] = defaultdict(list)
    for target in targets:
        by_deployment[target.deployment_id].append(target)
    memory = Memory()
    for policy in policies:
        mine = by_deployment.get(policy.deployment_id, [])
        if not mine:
            continue
        try:
            _evaluate_deployment(policy, mine, states, data, report, memory)
        except Exception:  # one deployment's trouble never stops the fleet's pass
            log.exception("autoscaler: evaluating %s failed", policy.deployment)
            report.failed.append(str(policy.deployment))
    memory.write()
    return report


def _targets(policies: list[AutoscalingPolicy]) -> list[DeploymentTarget]:
    modes = {p.deployment_id: p.mode for p in policies}
    regions = Region.objects.in_bulk()  # a handful of rows, not one Region built per target
    found = list(
        DeploymentTarget.objects.filter(
            deployment_id__in=[p.deployment_id for p in policies], role=TargetRole.STABLE
        )
        .exclude(status=TargetStatus.DELETED)
        .defer("cold_starts", "last_error")
    )
    for target in found:
        target.region = regions[target.region_id]
    # A Kubernetes region of a delegating policy is scaled by its cluster; other regions stay ours.
    return [t for t in found if not delegated(modes[t.deployment_id], t.region)]


def _values(
    targets: list[DeploymentTarget], policies: list[AutoscalingPolicy], report: Report, now: datetime
) -> dict[int, signals.Values]:
    """Every serving target's signals: one set of queries per Prometheus (regions that share one are asked
    together), and one read of the probes for all the regions without one."""
    windows = {p.deployment_id: int(p.spec.get("window_seconds", Policy.window_seconds)) for p in policies}
    by_source: dict[str, list[DeploymentTarget]] = defaultdict(list)  # a Prometheus URL, or "": probes
    for target in targets:
        if target.desired_replicas and target.endpoints:
            by_source[target.region.prometheus_url].append(target)
    values: dict[int, signals.Values] = {}
    for found in by_source.values():
        window = max(windows[t.deployment_id] for t in found)  # one query per signal, whatever the count
        got, source = signals.region_values(found[0].region, found, window, now)
        values.update(got)
        report.sources |= {t.region.code: source for t in found}
    return values


def _last_requests(policies: list[AutoscalingPolicy], now: datetime) -> dict[tuple[int, str], datetime]:
    """When each (deployment, region) last took a request, within the longest idle window of any policy
    (a region's own, in its overrides, included)."""
    windows = [
        int(fields.get("idle_seconds", Policy.idle_seconds))
        for p in policies
        for fields in (p.spec, *p.overrides.values())
    ]
    longest = max(windows, default=0)
    idle = [p.deployment_id for p in policies if int(p.spec.get("min_replicas", 1)) == 0 or p.overrides]
    if not idle:
        return {}
    rows = (
        served_by_engines(
            UsageRecord.objects.filter(
                deployment_id__in=idle, started_at__gte=now - timedelta(seconds=longest)
            )
        )
        .values("deployment_id", "region")
        .annotate(last=Max("started_at"))
        .order_by()
    )
    return {(r["deployment_id"], r["region"]): r["last"] for r in rows}


def _free_gpus() -> dict[tuple[int, str], int]:
    used = {
        (r["region_id"], r["deployment__gpu_type"]): int(r["gpus"] or 0)
        for r in DeploymentTarget.objects.filter(LIVE_TARGETS)
        .values("region_id", "deployment__gpu_type")
        .annotate(gpus=Sum(F("desired_replicas") * F("deployment__gpu_count")))
        .order_by()
    }
    return {
        (pool.region_id, pool.gpu_type): pool.gpu_count - used.get((pool.region_id, pool.gpu_type), 0)
        for pool in GpuPool.objects.all()
    }


def _tenant_room(tenant_ids: set[int]) -> dict[int, int | None]:
    used = {
        r["deployment__owner_id"]: int(r["gpus"] or 0)
        for r in DeploymentTarget.objects.filter(LIVE_TARGETS, deployment__owner_id__in=tenant_ids)
        .values("deployment__owner_id")
        .annotate(gpus=Sum(F("desired_replicas") * F("deployment__gpu_count")))
        .order_by()
    }
    return {
        t.pk: None if t.max_gpus is None else t.max_gpus - used.get(t.pk, 0)
        for t in Tenant.objects.filter(pk__in=tenant_ids)
    }


def _evaluate_deployment(
    policy: AutoscalingPolicy,
    targets: list[DeploymentTarget],
    states: dict[int, ScalerState],
    data: Fleet,
    report: Report,
    memory: Memory,
) -> None:
    deployment = policy.deployment
    epoch = data.now.timestamp()
    decisions: dict[str, algorithm.Decision] = {}
    policies: dict[str, Policy] = {}
    spec = parse(policy.spec)  # once per deployment: each region only adds its overrides
    starting = _starting_elsewhere(targets)
    for target in targets:
        code, state = target.region.code, states[target.pk]
        policies[code] = effective(policy.spec, policy.overrides, code, spec_parsed=spec)
        decisions[code] = _decide(policies[code], target, state, data, epoch, starting.get(code, 0))
    changed, limited = _apply(deployment, targets, decisions, policies, data, report)
    for target in targets:
        code = target.region.code
        memory.remember(
            states[target.pk],
            target,
            decisions[code],
            changed.get(code),
            limited.get(code, ""),
            data.now,
            data.values.get(target.pk, {}),
            policies[code],
        )


def _decide(
    policy: Policy, target: DeploymentTarget, state: ScalerState, data: Fleet, epoch: float, starting: int
) -> algorithm.Decision:
    """The region's own decision; a scale-up counts the replicas still starting in the other regions of
    its group as its own not-ready ones (they share its traffic once ready), so a cold start there is
    not read as demand for more."""
    current = target.desired_replicas
    kwargs: dict[str, Any] = {
        "idle_seconds": _idle(target, state, data),
        "history": state.recommendations,
        "changes": state.changes,
        "now": epoch,
        # The replicas the signals come from: the ready ones (a Kubernetes target has one Service endpoint
        # for all its pods, so not len(endpoints)).
        "ready": target.ready_replicas,
    }
    values = data.values.get(target.pk, {})
    decision = algorithm.decide(policy, current, values, **kwargs)
    if decision.kind != DecisionKind.SCALE_UP or not starting:
        return decision
    # Sized with them, bounded as the region alone is: its max is for its own replicas.
    grown = replace(policy, max_replicas=policy.max_replicas + starting)
    shared = algorithm.decide(grown, current + starting, values, **kwargs)
    wanted = min(decision.replicas, max(current, shared.replicas - starting))
    if wanted == decision.replicas:
        return decision
    note = f"; {wanted} with the {starting} replica(s) starting in its overflow group"
    return replace(
        decision,
        replicas=wanted,
        kind=decision.kind if wanted > current else "",
        reason=decision.reason + note,
    )


def _starting_elsewhere(targets: list[DeploymentTarget]) -> dict[str, int]:
    """Per region: the replicas not ready yet in the other regions of its group."""
    out = {}
    for group in _groups(targets):
        starting = {t.region.code: max(0, t.desired_replicas - t.ready_replicas) for t in group}
        for code in starting:
            out[code] = sum(starting.values()) - starting[code]
    return out


def _idle(target: DeploymentTarget, state: ScalerState, data: Fleet) -> float:
    """Seconds since the region's last request, or since it was last scaled or changed state if later."""
    moments = [target.last_transition_at]
    if (last := data.last_request.get((target.deployment_id, target.region.code))) is not None:
        moments.append(last)
    seconds = data.now.timestamp() - max(m.timestamp() for m in moments)
    if state.changes:
        seconds = min(seconds, data.now.timestamp() - state.changes[-1][0])
    return max(0.0, seconds)


def _groups(targets: list[DeploymentTarget]) -> list[list[DeploymentTarget]]:
    """A region with the overflow regions that share its traffic; every other region on its own."""
    by_code = {t.region.code: t for t in targets}
    groups: dict[str, list[DeploymentTarget]] = defaultdict(list)
    for target in targets:
        home = target.overflow_of if target.overflow_of in by_code else target.region.code
        groups[home].append(target)
    return list(groups.values())


def _apply(
    deployment: Deployment,
    targets: list[DeploymentTarget],
    decisions: dict[str, algorithm.Decision],
    policies: dict[str, Policy],
    data: Fleet,
    report: Report,
) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """Place each group's change and write it; returns the changes made and the limits met, per region."""
    changed: dict[str, tuple[int, int]] = {}
    limited: dict[str, str] = {}
    weights, serving = weights_of(deployment.version), residency_of(deployment.owner)
    for group in _groups(targets):
        home = group[0].overflow_of or group[0].region.code
        idle = [t for t in group if decisions[t.region.code].kind == DecisionKind.SCALE_TO_ZERO]
        if idle and all(t in idle or not t.desired_replicas for t in group):  # the whole group is idle
            reason = decisions[idle[0].region.code].reason
            # Only the idle regions: one already at zero (paused by hand) must not start waking on requests.
            done = _scale(
                deployment,
                {t.region.code: 0 for t in idle},
                group,
                DecisionKind.SCALE_TO_ZERO,
                reason,
                decisions,
                report,
                wakes=True,
            )
            data.took(deployment, done)
            changed |= done
            continue
        # A home region at zero is woken by requests, not here; an overflow region at zero may grow again.
        members = [
            _member(
                t,
                decisions,
                policies,
                data,
                deployment,
                refused=residency_refusal(weights, t.region.jurisdiction, serving=serving) is not None,
            )
            for t in group
            if t.desired_replicas or t.overflow_of
        ]
        if not members:
            continue
        options = _options(deployment, group, data, home) if _wants_more(members, data, deployment) else []
        room = data.tenant_room.get(deployment.owner_id)
        quota = None if room is None else fleet.fits(room, deployment.gpu_count)
        plan = fleet.plan(members, quota, options)
        if plan.limited:
            limited[home] = plan.limited
            report.limited.append(f"{deployment}: {plan.limited}")
        if plan.replicas:
            kind = _kind(plan, group)
            reason = (
                "; ".join(decisions[m.code].reason for m in members if decisions[m.code].kind) or plan.limited
            )
            if plan.spilled_to:
                reason += f"; {home} is full: spilled to {plan.spilled_to}"
            done = _scale(
                deployment,
                plan.replicas,
                group,
                kind,
                reason,
                decisions,
                report,
                overflow_of=home if plan.spilled_to else "",
            )
            data.took(deployment, done)
            changed |= done
    return changed, limited


def _kind(plan: fleet.Plan, group: list[DeploymentTarget]) -> str:
    if plan.spilled_to:
        return DecisionKind.SCALE_OUT
    now = {t.region.code: t.desired_replicas for t in group}
    grew = any(count > now.get(code, 0) for code, count in plan.replicas.items())
    return DecisionKind.SCALE_UP if grew else DecisionKind.SCALE_DOWN


def _member(
    target: DeploymentTarget,
    decisions: dict[str, algorithm.Decision],
    policies: dict[str, Policy],
    data: Fleet,
    deployment: Deployment,
    *,
    refused: bool,
) -> fleet.Member:
    """One region of a group; a region residency now refuses (narrowed since it was placed: routing sends
    it nothing) has no room: it may shrink, never grow."""
    code, policy = target.region.code, policies[target.region.code]
    free = data.free_gpus.get((target.region_id, deployment.gpu_type), 0)
    return fleet.Member(
        code=code,
        current=target.desired_replicas,
        wanted=decisions[code].replicas,
        floor=0 if target.overflow_of else max(policy.min_replicas, 1),
        ceiling=policy.max_replicas,
        room=0 if refused else fleet.fits(free, deployment.gpu_count),
        price=_price(data, target.region, deployment.gpu_type),
    )


def _price(data: Fleet, region: Region, gpu_type: str) -> Decimal:
    found = data.price(region, gpu_type)
    return fleet.UNPRICED if found is None else Decimal(found)


def _wants_more(members: list[fleet.Member], data: Fleet, deployment: Deployment) -> bool:
    net = sum(m.wanted - m.current for m in members)
    return net > sum(min(m.room, m.ceiling - m.current) for m in members)


def _options(
    deployment: Deployment, group: list[DeploymentTarget], data: Fleet, home: str
) -> list[fleet.Option]:
    """Compliant regions (``placement.region_choices``: residency, an active region, GPUs of the type) the
    deployment is not in, with the replicas that fit there. Asked only when the group needs them."""
    present = set(
        deployment.targets.exclude(status=TargetStatus.DELETED).values_list("region__code", flat=True)
    )
    choices = placement.region_choices(
        tenant=deployment.owner,
        version=deployment.version,
        gpu_type=deployment.gpu_type,
        gpu_count=deployment.gpu_count,
        replicas=1,
    )
    return [
        fleet.Option(
            c.region.code,
            fleet.fits(c.free_gpus, deployment.gpu_count),
            _price(data, c.region, deployment.gpu_type),
        )
        for c in choices
        if c.eligible and c.region.code not in present
    ]


def _scale(
    deployment: Deployment,
    replicas: dict[str, int],
    group: list[DeploymentTarget],
    kind: str,
    reason: str,
    decisions: dict[str, algorithm.Decision],
    report: Report,
    *,
    wakes: bool = False,
    overflow_of: str = "",
) -> dict[str, tuple[int, int]]:
    before = {t.region.code: t.desired_replicas for t in group}
    detail = {"signals": {code: d.signals for code, d in decisions.items() if code in replicas and d.signals}}
    try:
        targets_scale(
            actor=AUTOSCALER,
            deployment=deployment,
            replicas=replicas,
            reason=reason,
            kind=kind,
            detail=detail,
            wakes_on_request=wakes,
            overflow_of=overflow_of,
        )
    except ApplicationError as exc:  # raced a manual scale, a rollout, the last GPUs: next pass decides again
        log.info("autoscaler: %s not scaled: %s", deployment, exc)
        return {}
    report.scaled.append(f"{deployment}: {reason}")
    return {code: (before.get(code, 0), count) for code, count in replicas.items()}
