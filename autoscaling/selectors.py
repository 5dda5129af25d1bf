"""What people may read of autoscaling: a deployment's policy, its regions' scaler state, its decisions."""

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from autoscaling.models import AutoscalingPolicy, ScalerState, ScalingDecision
from core.choices import Scope
from core.principal import Principal
from core.selectors import scoped
from regions.choices import TargetRole, TargetStatus
from regions.models import Deployment


@dataclass(frozen=True)
class RegionScaling:
    """One region of a deployment as the autoscaler sees it."""

    region: str
    replicas: int
    ready: int
    wakes_on_request: bool
    overflow_of: str
    signals: dict[str, float]
    limited: str
    samples: list[Any]


def decisions_for(principal: Principal) -> QuerySet[ScalingDecision]:
    queryset = ScalingDecision.objects.select_related("deployment__owner", "region")
    return scoped(queryset, principal, Scope.DEPLOYMENTS_READ, field="deployment__owner")


def scaling_of(principal: Principal, deployment: Deployment) -> dict[str, Any]:
    """The policy (or None), every serving region's replicas and scaler state, the last decisions."""
    principal.require(Scope.DEPLOYMENTS_READ, deployment.owner_id)
    policy = AutoscalingPolicy.objects.filter(deployment=deployment).first()
    targets = (
        deployment.targets.filter(role=TargetRole.STABLE)
        .exclude(status=TargetStatus.DELETED)
        .select_related("region")
    )
    states = {s.target_id: s for s in ScalerState.objects.filter(target__in=targets)}
    regions = [
        RegionScaling(
            region=t.region.code,
            replicas=t.desired_replicas,
            ready=t.ready_replicas,
            wakes_on_request=t.wakes_on_request,
            overflow_of=t.overflow_of,
            signals=states[t.pk].signals if t.pk in states else {},
            limited=states[t.pk].limited if t.pk in states else "",
            samples=states[t.pk].samples if t.pk in states else [],
        )
        for t in targets
    ]
    decisions = ScalingDecision.objects.filter(deployment=deployment).select_related("region")[:50]
    return {"policy": policy, "regions": regions, "decisions": list(decisions)}


def capacity_limited(deployment: Deployment) -> str:
    """Why the deployment cannot grow anywhere ('' when it can): shown on its page and in the API."""
    found = ScalerState.objects.filter(target__deployment=deployment).exclude(limited="").first()
    return found.limited if found else ""
