"""A fleet for the autoscaler without engines: deployments of the tiny model in local process regions whose
targets are set ready by hand, with the load the router's prober would have written for each endpoint
(``routing.models.EndpointHealth``, what the autoscaler reads without a Prometheus), prices in the billing
catalog and requests in the usage log. Nothing here starts a process: the tests run in a rolled-back
transaction, so the reconcile messages that scales enqueue after commit are never sent."""

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from autoscaling.models import ScalerState, ScalingDecision
from autoscaling.services.policies import policy_set
from billing.models import GpuPrice, UsageRecord
from core.principal import Principal
from regions.models import Deployment, DeploymentTarget, Region
from regions.services.deployments import deployment_create
from registry.models import ModelVersion
from routing.models import EndpointHealth

NOW = datetime(2031, 3, 3, 12, 0, tzinfo=UTC)  # a fixed instant: every pass is given its own `now`
LONG_AGO = NOW - timedelta(days=1)


def deploy(
    actor: Principal, version: ModelVersion, regions: list[str], name: str = "chat", replicas: int = 1
) -> Deployment:
    return deployment_create(
        actor=actor,
        owner=version.model.owner,
        name=name,
        model=version.model,
        version=version.version,
        regions=regions,
        replicas=replicas,
    )


def target(deployment: Deployment, code: str) -> DeploymentTarget:
    return DeploymentTarget.objects.select_related("region").get(
        deployment=deployment, region__code=code, role="stable"
    )


def endpoint_urls(found: DeploymentTarget, count: int) -> list[str]:
    return [f"http://127.0.0.1:{20_000 + found.pk * 16 + index}" for index in range(count)]


def serve(
    deployment: Deployment,
    code: str,
    *,
    ready: int | None = None,
    at: datetime = NOW,
    **load: float,
) -> DeploymentTarget:
    """The region's target ready with ``ready`` endpoints (default: its desired replicas), each probed at
    ``at`` with the same ``load`` (running, waiting, kv_cache); ready since long ago."""
    found = target(deployment, code)
    count = found.desired_replicas if ready is None else ready
    urls = endpoint_urls(found, count)
    DeploymentTarget.objects.filter(pk=found.pk).update(
        status="ready" if count else "paused",
        ready_replicas=count,
        endpoints=urls,
        last_transition_at=LONG_AGO,
        observed_generation=deployment.generation,
    )
    EndpointHealth.objects.filter(url__startswith=f"http://127.0.0.1:{20_000 + found.pk * 16}").exclude(
        url__in=urls
    ).delete()
    for url in urls:
        EndpointHealth.objects.update_or_create(
            url=url, defaults={"region": found.region, "checked_at": at, **load}
        )
    return target(deployment, code)


def follow(deployment: Deployment, *, at: datetime = NOW, **load: float) -> None:
    """Every live region of the deployment serving what it was scaled to, with ``load`` on each endpoint:
    what the reconciler and the prober would show a little later."""
    for live in deployment.targets.exclude(status="deleted").select_related("region"):
        serve(deployment, live.region.code, at=at, **load)


def price(region: Region | str, hourly: str, gpu_type: str = "L4") -> GpuPrice:
    found = region if isinstance(region, Region) else Region.objects.get(code=region)
    return GpuPrice.objects.create(
        region=found, gpu_type=gpu_type, hourly_price=Decimal(hourly), effective_from=NOW - timedelta(days=30)
    )


def request(deployment: Deployment, code: str, at: datetime, track: str = "stable") -> UsageRecord:
    """One request the gateway metered for the deployment in the region at ``at``."""
    return UsageRecord.objects.create(
        track=track,
        request_id=uuid.uuid4().hex,
        tenant=deployment.owner,
        model_name=deployment.name,
        region=code,
        deployment=deployment,
        version=str(deployment.version),
        status=200,
        latency_ms=12.0,
        started_at=at,
        hour=at.replace(minute=0, second=0, microsecond=0),
    )


def autoscale(actor: Principal, deployment: Deployment, **fields: Any) -> None:
    policy_set(actor=actor, deployment=deployment, body=fields)


def replicas(deployment: Deployment) -> dict[str, int]:
    """{region code: desired replicas} of the deployment's live stable targets."""
    return dict(
        deployment.targets.filter(role="stable")
        .exclude(status="deleted")
        .values_list("region__code", "desired_replicas")
    )


def decisions(deployment: Deployment) -> list[ScalingDecision]:
    return list(ScalingDecision.objects.filter(deployment=deployment).select_related("region").order_by("pk"))


def state(deployment: Deployment, code: str) -> ScalerState:
    return ScalerState.objects.get(target=target(deployment, code))
