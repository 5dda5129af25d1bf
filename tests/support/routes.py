"""For the route computation's tests: a placement (one ready deployment in one EU region, with any field
changed by keyword) and random worlds of tenants, regions and placements (a hypothesis strategy)."""

from typing import Any

from hypothesis import strategies as st

from routing.routes import Endpoint, Placement, TenantPolicy

JURISDICTIONS = ["EU", "US", "CH", "UK"]
LOCATIONS = {"EU": (50.1, 8.7), "US": (38.9, -77.0), "CH": (47.4, 8.5), "UK": (51.5, -0.1)}


def placement(**fields: Any) -> Placement:
    defaults: dict[str, Any] = {
        "tenant": "acme",
        "name": "chat",
        "deployment_id": 7,
        "version": "m@1",
        "served_model": "m",
        "artifact_sha256": "0" * 64,
        "allowed_jurisdictions": frozenset({"EU"}),
        "region": "eu-west-1",
        "jurisdiction": "EU",
        "region_active": True,
        "ready": True,
        "weights_verified": True,
        "endpoints": (Endpoint("http://127.0.0.1:1"),),
    }
    return Placement(**{**defaults, **fields})


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
                    region_active=(active := draw(st.booleans())),
                    draining=not active and draw(st.booleans()),
                    ready=draw(st.booleans()),
                    weights_verified=draw(st.booleans()),
                    endpoints=endpoints,
                    location=LOCATIONS[jurisdiction],
                    activatable=draw(st.booleans()),
                )
            )
    return tenants, placements
