"""Tells the registry which deployments still use a model version (it refuses to retire those)."""

from regions.choices import DeploymentState
from regions.models import Deployment
from registry.hooks import register_usage_checker
from registry.models import ModelVersion


@register_usage_checker
def deployments_using(version: ModelVersion) -> list[str]:
    live = (
        Deployment.objects.filter(version=version)
        .exclude(state=DeploymentState.DELETED)
        .select_related("owner")
    )
    return [f"deployment {d}" for d in live]
