"""A deployment idled to zero the way the autoscaler leaves it: a request held at a gateway wakes it."""

from regions.models import Deployment
from regions.services.deployments import targets_scale
from tests.support.principals import system


def idle_to_zero(deployment: Deployment, *regions: str) -> Deployment:
    return targets_scale(
        actor=system(),
        deployment=deployment,
        replicas=dict.fromkeys(regions, 0),
        reason="no request for 900 s (idle window 900 s)",
        kind="scale_to_zero",
        wakes_on_request=True,
    )
