"""What each caller may see of rollouts: operators every one, tenant members their tenants' own."""

from django.db.models import QuerySet

from core.choices import Scope
from core.errors import NotFound
from core.principal import Principal
from core.selectors import scoped
from regions.choices import TargetRole, TargetStatus
from regions.models import Deployment, DeploymentTarget
from rollouts.choices import ACTIVE_STATES, RolloutState
from rollouts.models import Rollout


def rollouts_for(principal: Principal) -> QuerySet[Rollout]:
    found = Rollout.objects.select_related("owner", "deployment", "candidate__model", "baseline")
    return scoped(found, principal, Scope.DEPLOYMENTS_READ, field="owner")


def rollout_get(principal: Principal, pk: int) -> Rollout:
    """404 for a rollout the caller may not see, exactly as for one that does not exist."""
    rollout = rollouts_for(principal).filter(pk=pk).first()
    if rollout is None:
        raise NotFound(f"No rollout {pk}.")
    return rollout


def active_rollouts(principal: Principal) -> QuerySet[Rollout]:
    return rollouts_for(principal).filter(state__in=ACTIVE_STATES)


def weights(rollout: Rollout) -> list[dict[str, object]]:
    """Per region of the rollout: where the candidate is, and its share of requests and of copies now.

    Once promoted, the candidate's revision is the deployment's stable one (its ``version`` is null then:
    the deployment's version), serving all of the region's requests until a later rollout replaces it."""
    found = DeploymentTarget.objects.filter(deployment=rollout.deployment_id).select_related("region")
    promoted = (
        rollout.state == RolloutState.SUCCEEDED
        and Deployment.objects.filter(pk=rollout.deployment_id, version=rollout.candidate_id).exists()
    )
    if promoted:
        found = found.filter(role=TargetRole.STABLE).exclude(status=TargetStatus.DELETED)
    else:
        found = found.filter(version=rollout.candidate)
    targets = {t.region.code: t for t in found.order_by("pk")}
    rows = []
    for wave, regions in enumerate(rollout.waves):
        for code in regions:
            target = targets.get(code)
            rows.append(
                {
                    "region": code,
                    "wave": wave + 1,
                    "candidate_status": target.status if target else "not started",
                    "candidate_role": target.role if target else "",
                    "traffic_percent": (100 if promoted else target.traffic_percent) if target else 0,
                    "mirror_percent": target.mirror_percent if target else 0,
                }
            )
    return rows
