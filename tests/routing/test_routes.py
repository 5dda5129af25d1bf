"""The route computation: residency is never crossed, whatever the regions, tenants and policies."""

from hypothesis import given
from hypothesis import strategies as st

from routing.routes import Endpoint, Placement, TenantPolicy, route, route_table

JURISDICTIONS = ["EU", "US", "CH", "UK"]
LOCATIONS = {"EU": (50.1, 8.7), "US": (38.9, -77.0), "CH": (47.4, 8.5), "UK": (51.5, -0.1)}


@st.composite
def worlds(draw):  # type: ignore[no-untyped-def]
    regions = draw(st.lists(st.sampled_from(JURISDICTIONS), min_size=1, max_size=6))
    tenants = [
        TenantPolicy(
            slug=f"t{n}",
            residency=frozenset(draw(st.sets(st.sampled_from(JURISDICTIONS), max_size=3))),
            home=draw(st.sampled_from([None, *LOCATIONS.values()])),
        )
        for n in range(draw(st.integers(1, 4)))
    ]
    placements = []
    for tenant in tenants:
        allowed = frozenset(draw(st.sets(st.sampled_from(JURISDICTIONS), max_size=4)))
        for index, jurisdiction in enumerate(regions):
            if not draw(st.booleans()):
                continue
            endpoints = tuple(
                Endpoint(
                    f"http://{tenant.slug}-{index}-{k}",
                    healthy=draw(st.booleans()),
                    running=draw(st.floats(0, 50)),
                    waiting=draw(st.floats(0, 50)),
                    kv_cache=draw(st.floats(0, 1)),
                )
                for k in range(draw(st.integers(0, 2)))
            )
            placements.append(
                Placement(
                    tenant=tenant.slug,
                    name="chat",
                    deployment_id=1,
                    version="m@1",
                    served_model="m",
                    artifact_sha256="0" * 64,
                    allowed_jurisdictions=allowed,
                    region=f"r{index}-{jurisdiction.lower()}",
                    jurisdiction=jurisdiction,
                    region_active=draw(st.booleans()),
                    ready=draw(st.booleans()),
                    weights_verified=draw(st.booleans()),
                    endpoints=endpoints,
                    location=LOCATIONS[jurisdiction],
                )
            )
    return tenants, placements


@given(worlds())
def test_an_endpoint_is_routed_only_inside_residency_and_only_when_it_can_serve(world):  # type: ignore[no-untyped-def]
    tenants, placements = world
    table = route_table(tenants, placements)
    where = {(p.tenant, p.region): p for p in placements}
    for tenant in tenants:
        for entry in table[tenant.slug]["models"].values():
            for endpoint in entry["endpoints"]:
                placement = where[(tenant.slug, endpoint["region"])]
                assert placement.jurisdiction in tenant.residency
                assert placement.jurisdiction in placement.allowed_jurisdictions
                assert placement.region_active and placement.ready and placement.weights_verified
                assert any(e.url == endpoint["url"] and e.healthy for e in placement.endpoints)
                assert 1 <= endpoint["weight"] <= 100
            if not entry["endpoints"]:
                assert "data residency" in entry["unavailable"]  # a 503 that names the constraint
            priorities = [e["priority"] for e in entry["endpoints"]]
            assert priorities == sorted(priorities)


def placement(region: str, jurisdiction: str, location, healthy: bool = True, **load: float) -> Placement:  # type: ignore[no-untyped-def]
    return Placement(
        tenant="acme",
        name="chat",
        deployment_id=7,
        version="tiny@1.0.0",
        served_model="tiny",
        artifact_sha256="a" * 64,
        allowed_jurisdictions=frozenset({"EU", "US"}),
        region=region,
        jurisdiction=jurisdiction,
        region_active=True,
        ready=True,
        weights_verified=True,
        endpoints=(Endpoint(f"http://{region}", healthy, **load),),
        location=location,
    )


def test_the_nearest_compliant_region_comes_first_and_failover_stays_inside_residency():
    policy = TenantPolicy("acme", frozenset({"EU"}), home=(53.3, -6.3))  # Dublin
    dublin, frankfurt, virginia = (53.3, -6.3), (50.1, 8.7), (38.9, -77.0)
    healthy = [placement("eu-central-1", "EU", frankfurt), placement("eu-west-1", "EU", dublin)]
    entry = route(policy, [*healthy, placement("us-east-1", "US", virginia)])
    assert [(e["region"], e["priority"]) for e in entry["endpoints"]] == [
        ("eu-west-1", 0),
        ("eu-central-1", 1),
    ]
    assert entry["preferred"] == "eu-west-1"
    both_down = route(
        policy,
        [
            placement("eu-west-1", "EU", dublin, healthy=False),
            placement("eu-central-1", "EU", frankfurt, healthy=False),
            placement("us-east-1", "US", virginia),
        ],
    )
    assert both_down["endpoints"] == []  # fail closed: never the healthy US region
    assert (
        "data residency (EU)" in both_down["unavailable"]
        and "eu-west-1 is unhealthy" in both_down["unavailable"]
    )


def test_load_lowers_the_weight():
    idle = Endpoint("http://a")
    busy = Endpoint("http://b", running=16, waiting=8)
    full = Endpoint("http://c", running=16, waiting=8, kv_cache=0.95)
    from routing.routes import weight

    assert weight(idle) == 100 and weight(idle) > weight(busy) > weight(full) >= 1


def test_price_breaks_a_tie_in_distance():
    from dataclasses import replace
    from decimal import Decimal

    policy = TenantPolicy("acme", frozenset({"EU"}), home=(50.1, 8.7))
    frankfurt = (50.1, 8.7)
    dear = replace(placement("eu-central-1", "EU", frankfurt), gpu_hour_price=Decimal("1.10"))
    cheap = replace(placement("eu-central-2", "EU", frankfurt), gpu_hour_price=Decimal("0.70"))
    regions = [e["region"] for e in route(policy, [dear, cheap])["endpoints"]]
    assert regions == ["eu-central-2", "eu-central-1"]
