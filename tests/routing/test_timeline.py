"""The failover timeline and audit log tell what failed and what came back, and nothing else: a deployment
coming up for the first time is neither a restore nor a failback; the deployment page keeps cold-start
timings out of its "Last error" column."""

import itertools
import re

import pytest

from core.models import AuditEvent
from regions.models import DeploymentTarget
from regions.services.deployments import deployment_create
from routing import health, selectors, services
from routing.models import RoutingEvent
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.regions import converge, tiny_version

pytestmark = pytest.mark.django_db(transaction=True)
LOCATIONS = {"eu-west-1": (53.3, -6.3), "eu-central-1": (50.1, 8.7)}


def _route(*regions: str, preferred: str = "eu-west-1") -> dict:  # type: ignore[type-arg]
    return {"endpoints": [{"region": r} for r in regions], "preferred": preferred}


def _table(world, route) -> dict:  # type: ignore[no-untyped-def, type-arg]
    return {world.tenant_a.slug: {"models": {"chat": route}}}


def _kinds() -> list[str]:
    return list(RoutingEvent.objects.order_by("at", "pk").values_list("kind", flat=True))


def test_first_service_is_neither_a_restore_nor_a_failback_but_real_ones_are_recorded(world):
    steps = [
        _route(),  # created, nothing ready yet
        _route("eu-central-1"),  # the farther region is ready first: first service, not a restore
        _route("eu-west-1", "eu-central-1"),  # the preferred one joins: not a failback, nothing failed
        _route("eu-central-1"),  # eu-west-1 fails: a failover
        _route("eu-west-1", "eu-central-1"),  # and comes back: a failback
        _route(),  # everything fails
        _route("eu-central-1"),  # served again: restored
    ]
    for generation, (before, after) in enumerate(itertools.pairwise(steps), start=2):
        services._record_moves(_table(world, before), _table(world, after), generation)
    assert _kinds() == ["failover", "failback", "unavailable", "restored"]
    audited = AuditEvent.objects.filter(action__startswith="routing.").order_by("seq")
    assert [a.action for a in audited] == [f"routing.{kind}" for kind in _kinds()]


def test_idling_to_zero_and_waking_on_a_request_is_not_an_outage_and_not_a_restore(world):
    at_zero = {**_route(), "activatable": {"deployment": 1, "region": "eu-west-1"}}
    steps = [
        _route("eu-west-1"),  # served
        at_zero,  # the autoscaler idled it: a request wakes it
        _route(),  # woken, starting
        _route("eu-west-1"),  # served again
        _route(),  # then it really fails
    ]
    for generation, (before, after) in enumerate(itertools.pairwise(steps), start=2):
        services._record_moves(_table(world, before), _table(world, after), generation)
    assert _kinds() == ["unavailable"]


def _ready(deployment) -> bool:  # type: ignore[no-untyped-def]
    converge(deployment)
    health.cycle()
    targets = DeploymentTarget.objects.filter(deployment=deployment)
    return all(t.status == "ready" for t in targets)


@pytest.mark.slow  # starts (simulated) engines
def test_a_fresh_deployment_records_nothing_in_the_timeline_and_no_error(
    world, make_region, tiny_model_dir, client
):
    for code, location in LOCATIONS.items():
        region = make_region(code, "EU")
        region.latitude, region.longitude = location
        region.save()
    world.tenant_a.home_region = "eu-west-1"
    world.tenant_a.save()
    version = tiny_version(principal(world.operator), tiny_model_dir)
    services.publish()
    deployment = deployment_create(
        actor=principal(world.alice),
        owner=world.tenant_a,
        name="chat",
        model=version.model,
        version="1.0.0",
        regions=list(LOCATIONS),
        min_regions=2,
    )
    # The farther region comes up first, then the preferred one, each round published like the router does.
    DeploymentTarget.objects.filter(deployment=deployment, region__code="eu-west-1").update(
        next_attempt_at="2999-01-01T00:00:00Z"
    )
    wait_for(lambda: _ready_in(deployment, "eu-central-1"), timeout=30, interval=0.3)
    wait_for(lambda: _ready(deployment), timeout=30, interval=0.3)
    for _ in range(4):
        health.cycle()
    route = selectors.current().body["tenants"][world.tenant_a.slug]["models"]["chat"]  # type: ignore[union-attr]
    assert route["endpoints"][0]["region"] == "eu-west-1"  # it serves from the preferred region now
    assert _kinds() == [] and not AuditEvent.objects.filter(action__startswith="routing.").exists()

    client.force_login(world.alice)
    page = client.get(f"/deployments/{world.tenant_a.slug}/chat/").content.decode()
    table = page[page.index('id="targets"') : page.index("</table>", page.index('id="targets"'))]
    headers = re.findall(r"<th>(.*?)</th>", table)
    for row in re.findall(r"<tr data-region=.*?</tr>", table, re.S):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        assert cells[headers.index("Last error")].strip() == "—"  # healthy: no error, no timings
        assert "total" in cells[headers.index("Cold start")]  # the timings have a column of their own


def _ready_in(deployment, code: str) -> bool:  # type: ignore[no-untyped-def]
    for target in DeploymentTarget.objects.filter(deployment=deployment, region__code=code):
        DeploymentTarget.objects.filter(pk=target.pk).update(lease_until=None)
        from regions.reconciler import reconcile_target

        reconcile_target(target.pk)
    health.cycle()
    return DeploymentTarget.objects.get(deployment=deployment, region__code=code).status == "ready"
