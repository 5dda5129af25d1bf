"""Placement that follows the fleet, with simulator engines in local process regions: a deployment placed
"in every compliant region" joins a compliant region when it is added or re-activated, never a region its
residency refuses; a draining region's replicas are re-placed and serve before the region's own retire
(capacity first, then drain); a region a narrowed residency policy refuses retires at once; an explicit
placement is left as its owner chose; every change is audited and on the deployment's timeline."""

import pytest

from core.models import AuditEvent, Tenant
from regions.models import DeploymentEvent, DeploymentTarget
from regions.services.deployments import deployment_create
from regions.services.fleet import placements_follow
from regions.services.regions import region_set_status
from routing import selectors as routing_selectors
from routing import services as routing
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.regions import converge, tiny_version

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def version(world, tiny_model_dir):  # type: ignore[no-untyped-def]
    return tiny_version(principal(world.operator), tiny_model_dir)


def deploy(world, version, regions=None):  # type: ignore[no-untyped-def]
    return deployment_create(
        actor=principal(world.alice),
        owner=world.tenant_a,
        name="chat" if regions is None else "pinned",
        model=version.model,
        version="1.0.0",
        regions=regions,
    )


def serving(deployment) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Region → desired replicas of the deployment's targets that serve (stable, not deleted)."""
    targets = deployment.targets.filter(role="stable").exclude(status="deleted").select_related("region")
    return {t.region.code: t.desired_replicas for t in targets}


def ready_everywhere(deployment, but: str = "") -> None:  # type: ignore[no-untyped-def]
    def ready() -> bool:
        converge(deployment)
        targets = deployment.targets.filter(role="stable").exclude(status="deleted").exclude(region__code=but)
        return all(t.status == "ready" and t.ready_replicas == t.desired_replicas for t in targets)

    wait_for(ready, timeout=60, interval=0.3)


def routed_regions(first_tier: bool = False) -> set[str]:
    """The regions acme's route may send to; ``first_tier``: where its requests go while everything is
    healthy."""
    routing.publish()
    table = routing_selectors.current()
    assert table is not None
    endpoints = table.body["tenants"]["acme"]["models"]["chat"]["endpoints"]
    first = min((e["priority"] for e in endpoints), default=0)
    return {e["region"] for e in endpoints if not first_tier or e["priority"] == first}


def followed(deployment) -> list[dict]:  # type: ignore[no-untyped-def]
    entries = AuditEvent.objects.filter(action="deployment.placement_followed", target_id=str(deployment.pk))
    return [e.after for e in entries.order_by("pk")]


def test_a_new_compliant_region_gets_the_deployment_and_a_refused_one_does_not(world, make_region, version):
    make_region("eu-west-1", "EU")
    chat, pinned = deploy(world, version), deploy(world, version, regions=["eu-west-1"])
    make_region("eu-central-1", "EU")
    make_region("us-east-1", "US")  # acme's data stays in the EU
    assert serving(chat) == {"eu-west-1": 1, "eu-central-1": 1}
    assert serving(pinned) == {"eu-west-1": 1}  # placed by its owner: left alone
    assert followed(chat) == [{"added": {"eu-central-1": 1}, "grown": {}, "retired": {}}]
    assert DeploymentEvent.objects.filter(deployment=chat, kind="placement", message__contains="eu-central-1")
    ready_everywhere(chat)
    assert routed_regions() == {"eu-west-1", "eu-central-1"}


def test_a_draining_regions_replicas_serve_elsewhere_before_it_retires(world, make_region, version):
    make_region("eu-west-1", "EU")
    central = make_region("eu-central-1", "EU")
    chat = deploy(world, version)
    ready_everywhere(chat)
    region_set_status(actor=principal(world.operator), region=central, status="draining")
    # Capacity first: eu-west-1 takes eu-central-1's replica, and eu-central-1's engine keeps running until
    # it serves there; requests go to the active region first, the draining one only when it cannot.
    assert serving(chat) == {"eu-west-1": 2, "eu-central-1": 1}
    assert routed_regions(first_tier=True) == {"eu-west-1"}
    assert routed_regions() == {"eu-west-1", "eu-central-1"}  # the draining one as the last resort
    placements_follow("periodic evaluation")  # the replacement is not ready yet: nothing retires
    assert serving(chat) == {"eu-west-1": 2, "eu-central-1": 1}
    assert DeploymentTarget.objects.get(deployment=chat, region=central).status == "ready"
    ready_everywhere(chat)
    placements_follow("periodic evaluation")
    assert serving(chat) == {"eu-west-1": 2}
    assert routed_regions() == {"eu-west-1"}
    leaving = DeploymentTarget.objects.get(deployment=chat, region=central)
    wait_for(
        lambda: converge(chat) or (not leaving.refresh_from_db() and leaving.status == "deleted"), timeout=30
    )
    assert [a["grown"] or a["retired"] for a in followed(chat)] == [
        {"eu-west-1": 2},
        {"eu-central-1": "region draining; its replicas serve in eu-west-1"},
    ]


def test_a_drain_with_nowhere_to_go_keeps_serving_until_a_region_joins(world, make_region, version):
    west = make_region("eu-west-1", "EU")
    chat = deploy(world, version)
    ready_everywhere(chat)
    region_set_status(actor=principal(world.operator), region=west, status="draining")
    assert serving(chat) == {"eu-west-1": 1}
    assert routed_regions() == {"eu-west-1"}  # draining, and still serving: there is nowhere else
    assert DeploymentEvent.objects.filter(deployment=chat, message__contains="no compliant region has room")
    make_region("eu-north-1", "EU")
    assert serving(chat) == {"eu-west-1": 1, "eu-north-1": 1}
    ready_everywhere(chat)
    placements_follow("periodic evaluation")
    assert serving(chat) == {"eu-north-1": 1}


def test_a_region_a_narrowed_residency_refuses_retires_at_once(world, make_region, version):
    Tenant.objects.filter(pk=world.tenant_a.pk).update(residency=["EU", "US"])
    world.tenant_a.refresh_from_db()
    make_region("eu-west-1", "EU")
    make_region("us-east-1", "US")
    chat = deploy(world, version)
    assert serving(chat) == {"eu-west-1": 1, "us-east-1": 1}
    Tenant.objects.filter(pk=world.tenant_a.pk).update(residency=["EU"])  # as tenant_update writes it
    placements_follow("periodic evaluation")
    assert serving(chat) == {"eu-west-1": 1}  # no waiting for capacity across a border
    assert "residency" in followed(chat)[-1]["retired"]["us-east-1"]


def test_a_disabled_region_that_comes_back_gets_the_deployment_again(world, make_region, version):
    make_region("eu-west-1", "EU")
    central = make_region("eu-central-1", "EU")
    chat = deploy(world, version)
    ready_everywhere(chat)
    operator = principal(world.operator)
    region_set_status(actor=operator, region=central, status="disabled")
    ready_everywhere(chat, but="eu-central-1")  # disabled: its engine is stopped
    placements_follow("periodic evaluation")
    assert serving(chat) == {"eu-west-1": 2}
    region_set_status(actor=operator, region=central, status="active")
    assert serving(chat) == {"eu-west-1": 2, "eu-central-1": 1}
    ready_everywhere(chat)
    assert routed_regions() == {"eu-west-1", "eu-central-1"}
