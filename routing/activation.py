"""Waking a deployment the autoscaler idled to zero, for requests held at a gateway (scale-from-zero).

A gateway names only the tenant and the model the held requests called. Which deployment and region wake
is read from the newest published route table: the route computation (``routing.routes``) is the one place
residency is decided, so an activation can only ever wake what the table already offered that tenant as
``activatable``, never a region outside its residency. The region's current replicas are then checked
under the same locks a scale takes, so gateways calling again while it starts (they retry every few
seconds while they hold requests) change nothing and write no second audit entry or decision.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from core.choices import AuditSource
from core.errors import Conflict, NotFound
from core.principal import Principal
from gateway import contract
from regions.choices import TargetRole, TargetStatus
from regions.models import Deployment, DeploymentTarget, GpuPool
from regions.services.deployments import targets_scale
from routing import selectors

GATEWAY = Principal.system("gateway", source=AuditSource.API)
# autoscaling.choices.DecisionKind.ACTIVATE: autoscaling comes after routing, so the value is named here.
ACTIVATE = "activate"


@dataclass(frozen=True)
class Activation:
    """What an activation found: the region woken (``woke``), or already on its way up (nothing written)."""

    deployment: Deployment
    region: str
    replicas: int
    woke: bool


def activate(*, tenant: str, model: str, held: int, now: datetime) -> Activation:
    """Wake the region the route table offers for ``tenant``'s ``model`` to one replica, unless it is
    already above zero. NotFound for a tenant or model the table does not have; Conflict
    ``not_activatable`` when the route is served, or is unavailable for another reason than idleness."""
    offer = _offer(tenant, model)
    with transaction.atomic():
        target = _locked_target(offer, tenant, model)
        if target.desired_replicas > 0:
            return Activation(target.deployment, offer["region"], target.desired_replicas, woke=False)
        if not target.wakes_on_request:
            raise Conflict(
                f"{target.deployment} was paused in {offer['region']} since the route table was published; "
                "only a deployment idled by the autoscaler wakes on a request.",
                code="not_activatable",
            )
        deployment = targets_scale(
            actor=GATEWAY,
            deployment=target.deployment,
            replicas={offer["region"]: 1},
            reason=f"{held} request(s) held at a gateway",
            kind=ACTIVATE,
            detail={"signals": {offer["region"]: {"held_requests": held}}, "requested_at": now.isoformat()},
            wakes_on_request=True,  # held, not refused, until it serves (the reconciler clears the mark)
        )
    return Activation(deployment, offer["region"], 1, woke=True)


def _offer(tenant: str, model: str) -> contract.Activatable:
    table = selectors.current()
    routes = table.body.get("tenants", {}).get(tenant) if table is not None else None
    if routes is None:
        raise NotFound(f"There is no tenant '{tenant}' in the route table.")
    route = routes["models"].get(model)
    if route is None:
        raise NotFound(f"The model '{model}' does not exist for {tenant}.")
    offer = route.get("activatable")
    if offer is None:
        why = "it is served" if route["endpoints"] else route.get("unavailable", "it cannot be served")
        raise Conflict(
            f"{tenant}'s {model} is not at zero waiting for a request: {why}.", code="not_activatable"
        )
    return offer


def _locked_target(offer: contract.Activatable, tenant: str, model: str) -> DeploymentTarget:
    """The offered region's serving target, locked. The GPU pools are locked first, in the order
    ``targets_scale`` locks them, so an activation and a scale (or two activations) queue behind each
    other instead of deadlocking, and the second one reads the replicas the first one wrote."""
    deployment = Deployment.objects.filter(pk=offer["deployment"]).first()
    if deployment is not None:
        list(GpuPool.objects.select_for_update().filter(gpu_type=deployment.gpu_type).order_by("pk"))
    target = (
        DeploymentTarget.objects.select_for_update(of=("self",))
        .filter(deployment_id=offer["deployment"], region__code=offer["region"], role=TargetRole.STABLE)
        .exclude(status=TargetStatus.DELETED)
        .select_related("deployment__owner", "region")
        .first()
    )
    if target is None:
        raise Conflict(
            f"{tenant}'s {model} is no longer deployed in {offer['region']}.", code="not_activatable"
        )
    return target
