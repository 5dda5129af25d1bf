"""The scaling decision for one region of one deployment: pure, no database, the clock passed in.

Kubernetes' HPA v2 algorithm, on vLLM's signals:

1. per metric, ``desired = ceil(current × value / target)``, unless ``value / target`` is within the
   tolerance of 1 (then ``current``); replicas not ready yet count as idle on the way up and are left
   out on the way down (HPA's not-yet-ready pods); several metrics: the largest recommendation wins;
2. stabilization: scaling up goes no higher than the lowest recommendation of the up window, down no
   lower than the highest of the down window (defaults 0 s and 300 s: up at once, down after 5 minutes
   of lower demand);
3. rate limits: from the replicas at the start of the period, at most +max(percent, replicas) up and
   −replicas down per period;
4. bounds: ``max(min_replicas, 1) .. max_replicas``; with ``min_replicas = 0`` a region with no request
   for ``idle_seconds`` goes to zero (and a request held at the gateway brings it back, elsewhere).

A region at zero stays there: the autoscaler never wakes one on a metric (there is no engine to
measure); it is woken by a held request, or by a person.
"""

import itertools
import math
from dataclasses import dataclass, field

from autoscaling.choices import DecisionKind
from autoscaling.policy import Policy

Recommendations = list[list[float]]  # [[epoch, replicas], ...]: each a change of the raw recommendation
Changes = list[list[float]]  # [[epoch, from, to], ...]


@dataclass(frozen=True)
class Decision:
    replicas: int
    kind: str  # a DecisionKind, or "" when nothing changes
    reason: str
    recommendations: Recommendations = field(default_factory=list)
    signals: dict[str, dict[str, float]] = field(default_factory=dict)  # metric: value, target, replicas


def per_metric(
    policy: Policy, current: int, values: dict[str, float], ready: int | None = None
) -> dict[str, dict[str, float]]:
    """Each targeted metric with a value: the value, its target and the replicas it asks for.

    ``values`` are per replica over the ``ready`` replicas that report (all of ``current`` when None).
    As HPA does with pods not ready yet: on the way up they count as idle (the ready ones' load is shared
    once they serve, so a cold start does not look like demand for ever more replicas), on the way down
    only the ready ones are sized."""
    ready = current if ready is None else max(0, min(ready, current))
    out = {}
    for name, target in policy.targets().items():
        if name not in values:
            continue  # no signal this pass (a new engine, Prometheus down): it asks for nothing
        value = values[name]
        out[name] = {
            "value": round(value, 4),
            "target": target,
            "replicas": _wanted(policy, current, ready, value / target),
        }
    return out


def _wanted(policy: Policy, current: int, ready: int, ratio: float) -> int:
    if ratio > 1 and ready < current:
        ratio = ratio * ready / current  # the replicas still starting at 0 % of the target
        if ratio < 1 or abs(ratio - 1) <= policy.tolerance:
            return current
        return math.ceil(current * ratio - 1e-9)
    if abs(ratio - 1) <= policy.tolerance:
        return current
    return math.ceil(ready * ratio - 1e-9)


def stabilize(
    policy: Policy, current: int, raw: int, history: Recommendations, now: float
) -> tuple[int, Recommendations]:
    """HPA's stabilization over the recorded recommendations (a step function of change points), and the
    history to keep: the new point if the raw recommendation changed, nothing older than the windows."""
    keep = max(policy.scale_up_stabilization_seconds, policy.scale_down_stabilization_seconds)
    points = [p for p in history if p[0] <= now]
    if not points or points[-1][1] != raw:
        points.append([now, raw])
    up = down = raw  # the last point is this pass's raw recommendation; earlier ones held until the next
    for (_, value), (until, _) in itertools.pairwise(points):
        if until > now - policy.scale_up_stabilization_seconds:
            up = min(up, int(value))
        if until > now - policy.scale_down_stabilization_seconds:
            down = max(down, int(value))
    # The last point older than the window still holds at its start; everything before it can go.
    first = max((i for i, p in enumerate(points) if p[0] <= now - keep), default=0)
    return min(max(current, up), down), points[first:]


def rate_limit(policy: Policy, current: int, desired: int, changes: Changes, now: float) -> int:
    """At most the policy's step per period, counted from the replicas at the period's start."""
    if desired > current:
        added = sum(
            max(0.0, to - frm) for at, frm, to in changes if at > now - policy.scale_up_period_seconds
        )
        start = current - int(added)
        limit = max(start + policy.scale_up_replicas, math.ceil(start * (1 + policy.scale_up_percent / 100)))
        return max(current, min(desired, limit))
    if desired < current:
        removed = sum(
            max(0.0, frm - to) for at, frm, to in changes if at > now - policy.scale_down_period_seconds
        )
        start = current + int(removed)
        return min(current, max(desired, start - policy.scale_down_replicas))
    return desired


def decide(
    policy: Policy,
    current: int,
    values: dict[str, float],
    *,
    idle_seconds: float,
    history: Recommendations,
    changes: Changes,
    now: float,
    ready: int | None = None,
) -> Decision:
    """The replicas this region should run now. ``idle_seconds``: how long since its last request (or
    since it was last scaled, whichever is later); ``ready``: the replicas the values come from."""
    if current == 0:
        return Decision(0, "", "at zero: a request held at the gateway wakes it", history)
    if policy.min_replicas == 0 and idle_seconds >= policy.idle_seconds:
        return Decision(
            0,
            DecisionKind.SCALE_TO_ZERO,
            f"no request in the last {policy.idle_seconds} s (the idle window)",
            [],
        )
    signals = per_metric(policy, current, values, ready)
    if not signals:
        return Decision(current, "", "no signal this pass: keeping the replicas", history)
    raw = max(int(s["replicas"]) for s in signals.values())
    floor = max(policy.min_replicas, 1)
    raw = min(max(raw, floor), policy.max_replicas)
    stable, kept = stabilize(policy, current, raw, history, now)
    limited = min(max(rate_limit(policy, current, stable, changes, now), floor), policy.max_replicas)
    if limited == current:
        return Decision(current, "", _why(signals, current, raw, stable, limited), kept, signals)
    kind = DecisionKind.SCALE_UP if limited > current else DecisionKind.SCALE_DOWN
    return Decision(limited, kind, _why(signals, current, raw, stable, limited), kept, signals)


def _why(signals: dict[str, dict[str, float]], current: int, raw: int, stable: int, limited: int) -> str:
    parts = [f"{name} {s['value']:g} per replica against {s['target']:g}" for name, s in signals.items()]
    reason = "; ".join(parts) + f": {current} → {raw}"
    if stable != raw:
        reason += f", held at {stable} by the stabilization window"
    if limited != stable:
        reason += f", {limited} by the rate limit"
    return reason
