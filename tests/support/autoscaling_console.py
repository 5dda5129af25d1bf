"""An autoscaled fleet for the console, at a fixed moment ``NOW``, written straight into the database (no
evaluator, no engine): acme/chat in two EU regions with an hour of timeline samples and decisions, one
region at zero and one capacity-limited; globex/bot in the US, at zero, limited and just scaled."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from autoscaling.models import ScalerState, ScalingDecision
from autoscaling.services.policies import policy_set
from regions.choices import TargetStatus
from regions.models import Deployment, DeploymentTarget, Region
from regions.services.deployments import deployment_create
from tests.support.principals import World, principal
from tests.support.regions import tiny_version

NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
LIMITED = "capacity-limited: eu-west-1 has no free L4 GPU and no other compliant region has room"
POLICY = {"min_replicas": 0, "max_replicas": 4, "running": 4, "waiting": 2}


@dataclass
class Scaled:
    chat: Deployment  # acme's: eu-west-1 at 2 replicas and limited, eu-central-1 at zero
    bot: Deployment  # globex's: us-east-1 at zero, limited, scaled a minute ago
    west: DeploymentTarget
    central: DeploymentTarget


def samples(now: datetime = NOW) -> list[list[object]]:
    """An hour, one a minute: 1 replica, load rising past the target (4 running per replica), 2 then 3
    replicas, load easing, back to 2."""
    rows: list[list[object]] = []
    for minute in range(60, 0, -1):
        replicas = 1 if minute > 40 else 3 if 20 < minute <= 30 else 2
        running = 2.0 + (60 - minute) * 0.2 if minute > 30 else max(1.0, 8.0 - (30 - minute) * 0.25)
        rows.append([(now - timedelta(minutes=minute)).timestamp(), replicas, {"running": running}])
    return rows


def decision(deployment: Deployment, region: Region, kind: str, change: tuple[int, int], reason: str, at):  # type: ignore[no-untyped-def]
    return ScalingDecision.objects.create(
        deployment=deployment,
        region=region,
        kind=kind,
        from_replicas=change[0],
        to_replicas=change[1],
        reason=reason,
        signals={"running": 6.2},
        at=at,
    )


def _targets(deployment: Deployment) -> dict[str, DeploymentTarget]:
    return {t.region.code: t for t in deployment.targets.select_related("region")}


def scaled_fleet(world: World, make_region, tiny_model_dir, *, with_policy: bool = True) -> Scaled:  # type: ignore[no-untyped-def]
    for code, jurisdiction in (("eu-west-1", "EU"), ("eu-central-1", "EU"), ("us-east-1", "US")):
        make_region(code, jurisdiction)
    version = tiny_version(principal(world.operator), tiny_model_dir)
    alice, bob = principal(world.alice), principal(world.bob)
    chat = deployment_create(
        actor=alice,
        owner=world.tenant_a,
        name="chat",
        model=version.model,
        version="1.0.0",
        regions=["eu-west-1", "eu-central-1"],
    )
    bot = deployment_create(actor=bob, owner=world.tenant_b, name="bot", model=version.model, version="1.0.0")
    acme, globex = _targets(chat), _targets(bot)
    west, central, east = acme["eu-west-1"], acme["eu-central-1"], globex["us-east-1"]
    DeploymentTarget.objects.filter(pk=west.pk).update(
        status=TargetStatus.READY, desired_replicas=2, ready_replicas=2
    )
    DeploymentTarget.objects.filter(pk__in=[central.pk, east.pk]).update(
        status=TargetStatus.READY, desired_replicas=0, ready_replicas=0, wakes_on_request=True
    )
    ScalerState.objects.create(
        target=west,
        samples=samples(),
        signals={"running": 4.5, "waiting": 0.5},
        limited=LIMITED,
        evaluated_at=NOW,
    )
    ScalerState.objects.create(target=east, samples=[], limited="capacity-limited: us-east-1 is full")
    if with_policy:
        policy_set(actor=alice, deployment=chat, body=POLICY)
        policy_set(actor=bob, deployment=bot, body=POLICY)
    west_region, central_region = west.region, central.region
    decision(
        chat,
        west_region,
        "scale_up",
        (1, 2),
        "running 6.2 per replica over its target 4",
        NOW - timedelta(minutes=40),
    )
    decision(
        chat,
        west_region,
        "scale_up",
        (2, 3),
        "running 5.9 per replica over its target 4",
        NOW - timedelta(minutes=30),
    )
    decision(
        chat,
        west_region,
        "scale_down",
        (3, 2),
        "running 2.1 per replica under its target 4",
        NOW - timedelta(minutes=20),
    )
    decision(
        chat, central_region, "scale_to_zero", (1, 0), "no request for 900 s", NOW - timedelta(minutes=15)
    )
    decision(bot, east.region, "scale_to_zero", (1, 0), "no request for 900 s", NOW - timedelta(minutes=1))
    return Scaled(chat, bot, west, central)
