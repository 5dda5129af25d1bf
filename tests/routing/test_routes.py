"""The route computation: residency is never crossed, whatever the regions, tenants and policies, and a
rollout's candidate (the only thing a canary share or a shadow copy may reach) is named only where
residency lets the tenant be served by the candidate's own version, one tier with its region's baseline."""

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gateway import contract
from routing.routes import Endpoint, Placement, TenantPolicy, route, route_table
from tests.support.routes import JURISDICTIONS, LOCATIONS, worlds
from tests.support.routes import placement as one_placement


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
                assert (placement.region_active or placement.draining) and placement.ready
                assert placement.weights_verified
                assert any(e.url == endpoint["url"] and e.healthy for e in placement.endpoints)
                assert 1 <= endpoint["weight"] <= 100
            if not entry["endpoints"]:
                assert "data residency" in entry["unavailable"]  # a 503 that names the constraint
            priorities = [e["priority"] for e in entry["endpoints"]]
            assert priorities == sorted(priorities)
            # A draining region serves only in a tier after every active region's (capacity first).
            draining = [
                e["priority"] for e in entry["endpoints"] if where[(tenant.slug, e["region"])].draining
            ]
            active = [
                e["priority"] for e in entry["endpoints"] if where[(tenant.slug, e["region"])].region_active
            ]
            assert not draining or not active or min(draining) > max(active)


def _may_wake(tenant: TenantPolicy, placement: Placement) -> bool:
    return (
        placement.activatable
        and placement.region_active
        and placement.weights_verified
        and placement.jurisdiction in tenant.residency
        and placement.jurisdiction in placement.allowed_jurisdictions
    )


@given(worlds())
def test_a_region_is_offered_to_wake_only_inside_residency_and_only_when_nothing_serves(world):  # type: ignore[no-untyped-def]
    tenants, placements = world
    table = route_table(tenants, placements)
    for tenant in tenants:
        for entry in table[tenant.slug]["models"].values():
            mine = [p for p in placements if p.tenant == tenant.slug]
            offer = entry.get("activatable")
            if entry["endpoints"] or not any(_may_wake(tenant, p) for p in mine):
                assert offer is None  # served, or nowhere compliant to wake: a plain 503
                continue
            assert offer is not None
            woken = next(p for p in mine if p.region == offer["region"])
            assert _may_wake(tenant, woken)  # never a region outside residency, draining, or unverified
            assert offer["deployment"] == woken.deployment_id
            if not woken.ready:  # a ready one was just set to zero: its engine is still there, unhealthy
                assert f"{woken.region} is at zero replicas and wakes on a request" in entry["unavailable"]


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


@st.composite
def rollout_worlds(draw):  # type: ignore[no-untyped-def]
    """Random tenants and regions; in each region a stable revision and maybe a candidate whose version
    has its own allowed jurisdictions (a candidate may be narrower or wider than its baseline)."""
    regions = draw(st.lists(st.sampled_from(JURISDICTIONS), min_size=1, max_size=5))
    tenants = [
        TenantPolicy(f"t{n}", frozenset(draw(st.sets(st.sampled_from(JURISDICTIONS), max_size=3))))
        for n in range(draw(st.integers(1, 3)))
    ]
    placements = []
    for tenant in tenants:
        stable_allowed = frozenset(draw(st.sets(st.sampled_from(JURISDICTIONS), max_size=4)))
        candidate_allowed = frozenset(draw(st.sets(st.sampled_from(JURISDICTIONS), max_size=4)))
        for index, jurisdiction in enumerate(regions):
            base = Placement(
                tenant=tenant.slug,
                name="chat",
                deployment_id=1,
                version="m@1",
                served_model="m",
                artifact_sha256="0" * 64,
                allowed_jurisdictions=stable_allowed,
                region=f"r{index}-{jurisdiction.lower()}",
                jurisdiction=jurisdiction,
                region_active=True,
                ready=draw(st.booleans()),
                weights_verified=True,
                endpoints=(Endpoint(f"http://{tenant.slug}-{index}-stable"),),
                location=LOCATIONS[jurisdiction],
            )
            placements.append(base)
            if draw(st.booleans()):
                placements.append(
                    replace(
                        base,
                        version="m@2",
                        allowed_jurisdictions=candidate_allowed,
                        ready=draw(st.booleans()),
                        endpoints=(Endpoint(f"http://{tenant.slug}-{index}-candidate", draw(st.booleans())),),
                        track=contract.CANDIDATE,
                        traffic_percent=draw(st.integers(0, 100)),
                        mirror_percent=draw(st.integers(0, 100)),
                    )
                )
    return tenants, placements


@given(rollout_worlds())
def test_a_candidate_is_reachable_only_inside_residency_and_its_own_jurisdictions(world):  # type: ignore[no-untyped-def]
    tenants, placements = world
    table = route_table(tenants, placements)
    by_url = {e.url: p for p in placements for e in p.endpoints}
    for tenant in tenants:
        for entry in table[tenant.slug]["models"].values():
            candidates = [e for e in entry["endpoints"] if e["track"] == contract.CANDIDATE]
            for endpoint in candidates:
                served_by = by_url[endpoint["url"]]
                assert served_by.version == "m@2" and served_by.jurisdiction in tenant.residency
                assert served_by.jurisdiction in served_by.allowed_jurisdictions
            # A split exists exactly where a candidate endpoint is listed, and shares its region's tier.
            assert set(entry.get("splits", {})) == {e["region"] for e in candidates}
            tiers = {}
            for endpoint in entry["endpoints"]:
                assert tiers.setdefault(endpoint["region"], endpoint["priority"]) == endpoint["priority"]


def test_a_candidate_shares_its_regions_tier_and_carries_its_weights():
    policy = TenantPolicy("acme", frozenset({"EU"}), home=(53.3, -6.3))
    stable = placement("eu-west-1", "EU", (53.3, -6.3))
    candidate = replace(
        stable,
        version="tiny@2.0.0",
        endpoints=(Endpoint("http://eu-west-1-r1"),),
        track=contract.CANDIDATE,
        traffic_percent=25,
        mirror_percent=10,
    )
    other = placement("eu-central-1", "EU", (50.1, 8.7))
    entry = route(policy, [other, candidate, stable])
    assert [(e["region"], e["priority"], e["track"]) for e in entry["endpoints"]] == [
        ("eu-west-1", 0, "stable"),
        ("eu-west-1", 0, "candidate"),
        ("eu-central-1", 1, "stable"),
    ]
    assert entry["splits"] == {"eu-west-1": {"candidate": 25, "mirror": 10}}
    unhealthy = replace(candidate, endpoints=(Endpoint("http://eu-west-1-r1", healthy=False),))
    assert "splits" not in route(policy, [stable, unhealthy])  # nothing to split to: all baseline


def at_zero(region: str, jurisdiction: str, location, **fields: object) -> Placement:  # type: ignore[no-untyped-def]
    """Idled to zero by the autoscaler: no endpoints, not ready, a request wakes it."""
    return replace(
        placement(region, jurisdiction, location), ready=False, endpoints=(), activatable=True, **fields
    )


def test_a_route_at_zero_offers_the_nearest_compliant_idle_region_and_says_so():
    policy = TenantPolicy("acme", frozenset({"EU"}), home=(53.3, -6.3))  # Dublin
    paused = replace(at_zero("eu-west-1", "EU", (53.3, -6.3)), activatable=False)  # paused by hand
    idle = at_zero("eu-central-1", "EU", (50.1, 8.7))
    nearer_but_us = at_zero("us-east-1", "US", (40.7, -10.0))  # made nearer than Frankfurt: still refused
    entry = route(policy, [nearer_but_us, idle, paused])
    assert entry["endpoints"] == []
    assert entry["activatable"] == {"deployment": 7, "region": "eu-central-1"}
    assert "eu-central-1 is at zero replicas and wakes on a request" in entry["unavailable"]
    assert "eu-west-1 is not ready" in entry["unavailable"]  # paused: not offered
    assert "activatable" not in route(policy, [nearer_but_us, paused])  # only outside residency: 503


def test_nothing_is_offered_to_wake_while_a_region_serves_or_where_it_could_not_serve():
    policy = TenantPolicy("acme", frozenset({"EU"}), home=(53.3, -6.3))
    idle = at_zero("eu-central-1", "EU", (50.1, 8.7))
    serving = placement("eu-west-1", "EU", (53.3, -6.3))
    assert "activatable" not in route(policy, [serving, idle])
    assert "activatable" not in route(policy, [replace(idle, region_active=False)])
    unverified = route(policy, [replace(idle, weights_verified=False)])
    assert "activatable" not in unverified and "eu-central-1 is not ready" in unverified["unavailable"]
    gone_ready = replace(idle, ready=True, endpoints=(Endpoint("http://eu-central-1"),))
    assert route(policy, [gone_ready])["endpoints"]  # set to zero, engine not stopped yet: still serves


def test_a_region_taking_anothers_overflow_shares_its_tier_while_that_one_serves():
    policy = TenantPolicy("acme", frozenset({"EU"}), home=(53.3, -6.3))  # Dublin
    dublin, frankfurt, stockholm = (53.3, -6.3), (50.1, 8.7), (59.3, 18.1)
    spill = replace(placement("eu-north-1", "EU", stockholm), overflow_of="eu-west-1")
    entry = route(
        policy, [placement("eu-west-1", "EU", dublin), placement("eu-central-1", "EU", frankfurt), spill]
    )
    tiers = {e["region"]: e["priority"] for e in entry["endpoints"]}
    assert tiers == {"eu-west-1": 0, "eu-north-1": 0, "eu-central-1": 1}
    home_down = route(
        policy,
        [
            placement("eu-west-1", "EU", dublin, healthy=False),
            placement("eu-central-1", "EU", frankfurt),
            spill,
        ],
    )
    assert {e["region"]: e["priority"] for e in home_down["endpoints"]} == {
        "eu-central-1": 0,
        "eu-north-1": 1,
    }


@st.composite
def fallback_worlds(draw):  # type: ignore[no-untyped-def]
    """Every tenant may run `chat` (falling back to `small`, then to a name nobody runs) and `small`,
    each in random regions with its own version's jurisdictions; shared deployments of either name too."""
    tenants, placements = draw(worlds())
    more = []
    for placement in placements:
        name = draw(st.sampled_from(["chat", "small"]))
        allowed = frozenset(draw(st.sets(st.sampled_from(JURISDICTIONS), max_size=4)))
        fallbacks = ("small", "ghost") if name == "chat" else ("chat",)
        more.append(replace(placement, name=name, allowed_jurisdictions=allowed, fallbacks=fallbacks))
    return tenants, more


@given(fallback_worlds())
def test_a_fallback_is_only_ever_the_tenants_own_route_held_to_its_residency(world):  # type: ignore[no-untyped-def]
    tenants, placements = world
    table = route_table(tenants, placements)
    where = {(p.tenant, p.name, p.region): p for p in placements}
    for tenant in tenants:
        models = table[tenant.slug]["models"]
        for name, entry in models.items():
            for fallback in entry.get("fallbacks", []):
                assert fallback in models and fallback != name  # never a name the tenant has no route for
                for endpoint in models[fallback]["endpoints"]:
                    placement = where[(tenant.slug, fallback, endpoint["region"])]
                    assert placement.jurisdiction in tenant.residency
                    assert placement.jurisdiction in placement.allowed_jurisdictions
            assert "ghost" not in entry.get("fallbacks", [])


def test_fallbacks_are_published_in_order_without_unknown_names():
    policy = TenantPolicy("t", frozenset({"EU"}))
    base = one_placement(tenant="t", endpoints=(Endpoint("http://e"),), fallbacks=("tiny", "ghost", "small"))
    placements = [
        base,
        replace(base, name="small", fallbacks=()),
        replace(base, name="tiny", fallbacks=("chat",)),
    ]
    models = route_table([policy], placements)["t"]["models"]
    assert models["chat"]["fallbacks"] == ["tiny", "small"]
    assert "fallbacks" not in models["small"]
    assert models["tiny"]["fallbacks"] == ["chat"]
