"""Tells the registry which deployments still use a model version (it refuses to retire those), and
listens to its lifecycle to copy weights ahead of deployments."""

from regions.choices import DeploymentState
from regions.models import Deployment
from registry.choices import VersionStatus
from registry.models import ModelVersion
from registry.usage import on_transition, register_usage_checker


@register_usage_checker
def deployments_using(version: ModelVersion) -> list[str]:
    live = (
        Deployment.objects.filter(version=version)
        .exclude(state=DeploymentState.DELETED)
        .select_related("owner")
    )
    return [f"deployment {d}" for d in live]


@on_transition
def replicate_ahead_when_staged(version: ModelVersion, state: str) -> None:
    """A staged version is about to be deployed: start copying its weights into every region with an object
    store that residency lets hold them, so the first deployment there does not wait for the copy."""
    from django.conf import settings

    from controlplane.residency import residency_refusal, weights_of
    from regions.artifacts.replication import replica_for
    from regions.models import Region
    from regions.tasks import replicate_artifact

    if state != VersionStatus.STAGED or not settings.ARTIFACT_REPLICATE_ON_STAGED:
        return
    weights = weights_of(version)
    for region in Region.objects.exclude(object_store={}):
        if residency_refusal(weights, region.jurisdiction) is None:
            replicate_artifact.delay(replica_for(version, region).pk)
