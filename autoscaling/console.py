"""What the console shows of autoscaling, beyond ``selectors``: each region's effective policy and its last
signals against their targets, the scaling timeline drawn as SVG coordinates, and the fleet's deployments
at zero, scaling and capacity-limited. Reads only; every query is scoped by the principal."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet

from autoscaling.models import AutoscalingPolicy, ScalerState
from autoscaling.policy import METRICS, Policy, effective
from autoscaling.selectors import RegionScaling, decisions_for
from core.errors import ValidationFailed
from core.principal import Principal
from regions.choices import DeploymentState
from regions.models import Deployment, DeploymentTarget
from regions.selectors import LIVE_TARGETS, deployments_for

SCALING_WINDOW = timedelta(minutes=5)  # a decision this recent: the deployment is "scaling now"
TIMELINE = timedelta(hours=1)  # what ScalerState.samples keeps
FLEET_SHOWN = 8  # deployments named per group on the overview
SIGNAL_LABELS = {
    "waiting": "waiting requests / replica",
    "running": "running requests / replica",
    "kv_cache": "KV-cache usage",
    "ttft_p95_seconds": "TTFT p95 (s)",
}


def targets_of(policy: AutoscalingPolicy | None) -> list[tuple[str, str, float]]:
    """(signal, label, target) the deployment-wide policy sets, in METRICS order."""
    spec = policy.spec if policy is not None else {}
    return [(name, SIGNAL_LABELS[name], spec[name]) for name in METRICS if spec.get(name) is not None]


# --- one region -----------------------------------------------------------------------------------
def region_policy(policy: AutoscalingPolicy | None, region: str) -> Policy | None:
    """The policy the region runs under; None without one, or when the stored spec no longer parses (a
    rule tightened since it was saved: the page still renders, and the form says what to fix)."""
    if policy is None:
        return None
    try:
        return effective(policy.spec, policy.overrides, region)
    except ValidationFailed:
        return None


def signal_rows(policy: Policy | None, signals: dict[str, float]) -> list[dict[str, Any]]:
    """Each signal the policy targets or the autoscaler measured: last value, target, and whether over."""
    targets = policy.targets() if policy is not None else {}
    rows = []
    for name in METRICS:
        value, target = signals.get(name), targets.get(name)
        if value is None and target is None:
            continue
        ratio = value / target if value is not None and target else None
        tolerance = policy.tolerance if policy is not None else 0.0
        rows.append(
            {
                "signal": name,
                "label": SIGNAL_LABELS[name],
                "value": value,
                "target": target,
                "ratio": ratio,
                "over": ratio is not None and ratio > 1 + tolerance,  # the autoscaler would scale up
            }
        )
    return rows


def chosen_metric(policy: Policy | None, samples: list[Any], requested: str = "") -> str | None:
    """The signal the timeline draws: the one asked for if the policy targets it, else the one furthest
    above its target in the last sample (the one driving the decision, as the largest recommendation
    wins), else the first measured."""
    targets = policy.targets() if policy is not None else {}
    if requested in targets:
        return requested
    last = _values(samples[-1]) if samples else {}
    driving = [(last[name] / target, name) for name, target in targets.items() if name in last]
    if driving:
        return max(driving)[1]
    if targets:
        return next(iter(targets))
    return next((name for name in METRICS if name in last), None)


def _values(sample: Any) -> dict[str, float]:
    values = sample[2] if len(sample) > 2 and isinstance(sample[2], dict) else {}
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}


# --- the timeline ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Frame:
    """The drawing area of a timeline, in SVG user units."""

    width: int = 640
    height: int = 170
    left: int = 44
    right: int = 56
    top: int = 12
    bottom: int = 24

    @property
    def x1(self) -> int:
        return self.width - self.right

    @property
    def y1(self) -> int:
        return self.height - self.bottom

    # Sizes and where the axis labels go (the template cannot add).
    @property
    def plot_width(self) -> int:
        return self.x1 - self.left

    @property
    def plot_height(self) -> int:
        return self.y1 - self.top

    @property
    def mid(self) -> float:
        return (self.left + self.x1) / 2

    @property
    def left_label(self) -> int:
        return self.left - 6

    @property
    def right_label(self) -> int:
        return self.x1 + 6

    @property
    def top_label(self) -> int:
        return self.top + 4

    @property
    def time_label(self) -> int:
        return self.height - 6


FRAME = Frame()


@dataclass(frozen=True)
class Timeline:
    """Replicas as a step line and one signal with its target, over the last hour, ready to draw."""

    frame: Frame
    samples: int
    replicas_points: str
    replicas_top: int
    metric: str | None
    metric_label: str
    metric_segments: list[str]
    metric_top: float
    target: float | None
    target_y: float | None
    title: str


def _x(epoch: float, start: float, frame: Frame) -> float:
    span = TIMELINE.total_seconds()
    return round(
        frame.left + (min(max(epoch, start), start + span) - start) / span * (frame.x1 - frame.left), 1
    )


def _y(value: float, top: float, frame: Frame) -> float:
    return round(frame.y1 - min(max(value, 0.0), top) / top * (frame.y1 - frame.top), 1)


def _steps(samples: list[Any], start: float, now: float, top: int, frame: Frame) -> str:
    """The replicas held between samples: horizontal to the next sample, then vertical to its count."""
    points: list[tuple[float, float]] = []
    for epoch, replicas, *_ in samples:
        x, y = _x(epoch, start, frame), _y(replicas, top, frame)
        if points:
            points.append((x, points[-1][1]))
        points.append((x, y))
    points.append((_x(now, start, frame), points[-1][1]))
    return " ".join(f"{x},{y}" for x, y in points)


def _segments(samples: list[Any], metric: str, start: float, top: float, frame: Frame) -> list[str]:
    """The signal's line, broken where a sample has no value for it (no signal read in that pass)."""
    segments: list[list[str]] = [[]]
    for sample in samples:
        value = _values(sample).get(metric)
        if value is None:
            segments.append([])
            continue
        segments[-1].append(f"{_x(sample[0], start, frame)},{_y(value, top, frame)}")
    return [" ".join(points) for points in segments if points]


def timeline(
    samples: list[Any], *, now: datetime, policy: Policy | None, metric: str | None, frame: Frame = FRAME
) -> Timeline | None:
    """The last hour of ``samples`` ([[epoch, replicas, {signal: value}], ...]) drawn to ``frame``; None
    when none falls in it."""
    end = now.timestamp()
    start = end - TIMELINE.total_seconds()
    shown = sorted((s for s in samples if _well_formed(s) and start <= s[0] <= end), key=lambda s: s[0])
    if not shown:
        return None
    replicas_top = max([policy.max_replicas if policy else 1, *(int(s[1]) for s in shown), 1])
    target = policy.targets().get(metric) if policy is not None and metric else None
    values = [v for s in shown if metric and (v := _values(s).get(metric)) is not None]
    metric_top = max([*values, (target or 0) * 2, 1.0 if metric == "kv_cache" else 0.0]) or 1.0
    label = SIGNAL_LABELS.get(metric or "", "")
    title = f"Replicas {int(shown[0][1])} → {int(shown[-1][1])} over the last hour"
    if metric:
        title += f"; {label}" + (f" against a target of {target:g}" if target is not None else "")
    return Timeline(
        frame=frame,
        samples=len(shown),
        replicas_points=_steps(shown, start, end, replicas_top, frame),
        replicas_top=replicas_top,
        metric=metric,
        metric_label=label,
        metric_segments=_segments(shown, metric, start, metric_top, frame) if metric else [],
        metric_top=metric_top,
        target=target,
        target_y=_y(target, metric_top, frame) if target is not None else None,
        title=title,
    )


def _well_formed(sample: Any) -> bool:
    """[epoch, replicas, ...] with numbers: the state is the autoscaler's JSON, never trusted to draw."""
    return (
        isinstance(sample, list)
        and len(sample) >= 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in sample[:2])
    )


def region_view(
    region: RegionScaling, policy: AutoscalingPolicy | None, *, now: datetime, requested: str = ""
) -> dict[str, Any]:
    """Everything the page shows of one region."""
    effective_policy = region_policy(policy, region.region)
    metric = chosen_metric(effective_policy, region.samples, requested)
    return {
        "scaling": region,
        "policy": effective_policy,
        "signals": signal_rows(effective_policy, region.signals),
        "metric": metric,
        "metrics": list(effective_policy.targets()) if effective_policy else [],
        "timeline": timeline(region.samples, now=now, policy=effective_policy, metric=metric),
    }


# --- the fleet ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FleetGroup:
    key: str
    label: str
    hint: str
    count: int
    deployments: list[Deployment]  # the first FLEET_SHOWN, by name


def _group(key: str, label: str, hint: str, found: QuerySet[Deployment]) -> FleetGroup:
    ordered = found.order_by("owner__slug", "name")
    return FleetGroup(key, label, hint, ordered.count(), list(ordered[:FLEET_SHOWN]))


def fleet_scaling(principal: Principal, *, now: datetime) -> list[FleetGroup]:
    """The viewer's active deployments at zero (a request wakes them), scaling now (a decision in the last
    five minutes), and capacity-limited (a region could not grow anywhere); never another tenant's."""
    visible = deployments_for(principal).filter(state=DeploymentState.ACTIVE)
    live = DeploymentTarget.objects.filter(LIVE_TARGETS, deployment__in=visible)
    asleep = live.filter(wakes_on_request=True, desired_replicas=0).values("deployment_id")
    recent = decisions_for(principal).filter(at__gt=now - SCALING_WINDOW, at__lte=now)
    limited = ScalerState.objects.filter(target__in=live).exclude(limited="").values("target__deployment_id")
    minutes = int(SCALING_WINDOW.total_seconds() // 60)
    return [
        _group(
            "at_zero", "At zero", "idle, scaled away; a request wakes them", visible.filter(pk__in=asleep)
        ),
        _group(
            "scaling",
            "Scaling now",
            f"a change of replicas in the last {minutes} minutes",
            visible.filter(pk__in=recent.values("deployment_id")),
        ),
        _group(
            "limited", "Capacity-limited", "a region could not grow anywhere", visible.filter(pk__in=limited)
        ),
    ]
