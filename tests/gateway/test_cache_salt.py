"""Shared deployments serve every tenant with prefix caching on: each tenant's requests carry its own
``cache_salt`` (which no other tenant can compute or choose), so no tenant can time another's prefixes."""

import pytest

from routing import selectors, services
from routing.routes import Endpoint, Placement, TenantPolicy, route
from tests.support.gateway_harness import GatewayWorld


@pytest.fixture
def gw(tmp_path):  # type: ignore[no-untyped-def]
    world = GatewayWorld(tmp_path)
    yield world
    world.close()


def salts_seen(gw) -> list[str | None]:  # type: ignore[no-untyped-def]
    return [seen["body"].get("cache_salt") for seen in gw.engine.seen]


def test_each_tenant_gets_its_own_salt_on_a_shared_deployment(gw):
    for tenant in ("acme", "globex", "acme", "globex"):
        assert gw.chat(tenant=tenant, model="shared").status == 200
    acme, globex, acme_again, globex_again = salts_seen(gw)
    assert acme and globex and acme != globex
    assert (acme, globex) == (acme_again, globex_again)  # stable: the tenant's own prefixes stay cached
    assert acme == gw.control.table["cache_salts"]["acme"]


def test_a_client_salt_cannot_pick_another_tenants_namespace(gw):
    theirs = gw.control.table["cache_salts"]["globex"]
    assert gw.chat(tenant="globex", model="shared").status == 200
    for chosen in (theirs, "globex", "", None):
        extra = {} if chosen is None else {"cache_salt": chosen}
        answer = gw.chat(tenant="acme", model="shared", **extra)
        assert answer.status == (400 if chosen == "" else 200)
    sent = salts_seen(gw)
    assert sent[0] == theirs and theirs not in sent[1:]
    mine = gw.control.table["cache_salts"]["acme"]
    assert all(salt.startswith(mine) for salt in sent[1:])  # a client salt only subdivides acme's own


def test_a_dedicated_deployment_keeps_the_clients_salt(gw):
    assert gw.chat(model="chat").status == 200
    assert gw.chat(model="chat", cache_salt="per-user-7").status == 200
    assert salts_seen(gw) == [None, "per-user-7"]


def test_a_table_without_salts_still_isolates_tenants(gw):
    del gw.control.table["cache_salts"]
    for tenant in ("acme", "globex"):
        assert gw.chat(tenant=tenant, model="shared").status == 200
    acme, globex = salts_seen(gw)
    assert acme and globex and acme != globex and "acme" not in acme


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
    from regions.services.deployments import deployment_create
    from registry.models import RegisteredModel
    from tests.support.principals import principal
    from tests.support.regions import tiny_version, until_ready

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
