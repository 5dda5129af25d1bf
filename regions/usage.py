"""Tells the registry which deployments still use a model version (it refuses to retire those)."""

from django.db.models import Q

from regions.choices import DeploymentState, TargetStatus
from regions.models import Deployment
from registry.hooks import register_usage_checker
from registry.models import ModelVersion

LIVE_REVISION_STATES = [s for s in TargetStatus.values if s != TargetStatus.DELETED]


@register_usage_checker
def deployments_using(version: ModelVersion) -> list[str]:
    """Deployments running the version: as their version, or as a revision (a rollout's candidate, a
    baseline still draining) that has not been deleted."""
    live = (
        Deployment.objects.filter(
            Q(version=version) | Q(targets__version=version, targets__status__in=LIVE_REVISION_STATES)
        )
        .exclude(state=DeploymentState.DELETED)
        .select_related("owner")
        .distinct()
    )
    return [f"deployment {d}" for d in live]
