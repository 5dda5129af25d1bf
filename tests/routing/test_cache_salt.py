"""What routing publishes for cache isolation: every tenant's ``cache_salt`` (to gateways only, never
guessable) and which endpoints are shared deployments. The gateway's use of them is tests/gateway."""

import pytest

from regions.services.deployments import deployment_create
from registry.models import RegisteredModel
from routing import selectors, services
from routing.routes import Endpoint, Placement, TenantPolicy, route
from tests.support.principals import principal
from tests.support.regions import tiny_version, until_ready


def placement(shared: bool) -> Placement:
    return Placement(
        tenant="t",
        name="chat",
        deployment_id=1,
        version="m@1",
        served_model="m",
        artifact_sha256="",
        allowed_jurisdictions=frozenset({"EU"}),
        region="eu-west-1",
        jurisdiction="EU",
        region_active=True,
        ready=True,
        weights_verified=True,
        endpoints=(Endpoint("http://e"),),
        shared=shared,
    )


def test_the_route_table_says_which_endpoints_are_shared():
    policy = TenantPolicy(slug="t", residency=frozenset({"EU"}))
    assert route(policy, [placement(shared=True)])["endpoints"][0]["shared"] is True  # type: ignore[index]
    assert route(policy, [placement(shared=False)])["endpoints"][0]["shared"] is False  # type: ignore[index]


@pytest.mark.django_db
def test_salts_are_published_to_gateways_only_and_cannot_be_guessed(world, api):
    salts = services.publish().body["cache_salts"]
    assert set(salts) == {world.tenant_a.slug, world.tenant_b.slug}
    assert len(set(salts.values())) == 2 and all(
        len(s) == 32 and s not in ("acme", "globex") for s in salts.values()
    )
    assert selectors.cache_salts() == salts  # stable across publications
    mine = api(world.alice).get("/api/v1/routing/table/").json()
    assert "cache_salts" not in mine and salts[world.tenant_b.slug] not in str(mine)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_published_table_marks_a_shared_deployment_and_only_it(world, make_region, tiny_model_dir):
    make_region("eu-west-1", "EU")
    tiny_version(principal(world.operator), tiny_model_dir)
    catalog = RegisteredModel.objects.get(name="tiny-llama", owner=None)
    shared = deployment_create(
        actor=principal(world.operator),
        owner=world.tenant_a,
        name="assistant",
        model=catalog,
        version="1.0.0",
        regions=["eu-west-1"],
        shared=True,
    )
    own = deployment_create(
        actor=principal(world.alice),
        owner=world.tenant_a,
        name="mine",
        model=catalog,
        version="1.0.0",
        regions=["eu-west-1"],
    )
    until_ready(shared)
    until_ready(own)
    models = services.publish().body["tenants"][world.tenant_a.slug]["models"]
    assert [e["shared"] for e in models["assistant"]["endpoints"]] == [True]
    assert [e["shared"] for e in models["mine"]["endpoints"]] == [False]
