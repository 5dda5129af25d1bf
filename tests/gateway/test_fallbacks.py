"""Compliant fallbacks: when the model asked for has no compliant endpoint, is saturated, or the tenant is
past its budget's degrade threshold, the first of its fallbacks that can serve answers instead, with
x-degraded saying why; the usage record names both models. A fallback is only ever one of the tenant's own
routes (which the control plane held to its residency): a name the tenant has no route for is never used."""

import pytest

from tests.support.gateway_harness import GatewayWorld, endpoint


@pytest.fixture
def gw(tmp_path):  # type: ignore[no-untyped-def]
    world = GatewayWorld(tmp_path)
    (small,) = world.engines(1)
    models = world.gateway.routes.body["tenants"]["acme"]["models"]
    models["small"] = {
        "endpoints": [{**endpoint(small.url), "deployment": 2, "version": "s@1"}],
        "preferred": "eu-west-1",
    }
    models["chat"]["fallbacks"] = ["small"]
    world.small = small  # type: ignore[attr-defined]
    yield world
    world.close()


def acme_chat(gw: GatewayWorld) -> dict:  # type: ignore[type-arg]
    return gw.gateway.routes.body["tenants"]["acme"]["models"]["chat"]


def records(gw: GatewayWorld) -> list[dict]:  # type: ignore[type-arg]
    gw.ship()
    return gw.control.records


def test_a_model_with_no_compliant_endpoint_is_served_by_its_fallback(gw):
    acme_chat(gw).update(
        endpoints=[], unavailable="no healthy region within the tenant's data residency (EU)"
    )
    answer = gw.chat()
    assert answer.status == 200 and answer.headers["x-degraded"] == "unavailable"
    assert answer.headers["x-model-version"] == "s@1" and len(gw.small.seen) == 1 and not gw.engine.seen
    (record,) = records(gw)
    assert (record["model_name"], record["served_model_name"], record["degraded"]) == (
        "chat",
        "small",
        "unavailable",
    )
    assert record["version"] == "s@1"


def test_a_saturated_model_spills_to_its_fallback_and_a_healthy_one_does_not(gw):
    assert "x-degraded" not in gw.chat().headers and len(gw.engine.seen) == 1
    acme_chat(gw)["endpoints"][0]["saturated"] = True
    answer = gw.chat(headers={"x-priority": "batch"})  # would be shed on the primary
    assert answer.status == 200 and answer.headers["x-degraded"] == "capacity" and len(gw.small.seen) == 1


def test_past_the_degrade_threshold_the_tenant_is_served_by_fallbacks(gw):
    gw.gateway.routes.body["tenants"]["acme"]["degraded"] = "budget: 80 % of the monthly budget is spent"
    answer = gw.chat()
    assert answer.headers["x-degraded"] == "budget" and len(gw.small.seen) == 1
    assert gw.chat(model="shared").status == 200  # a model without fallbacks is served as it is


def test_no_usable_fallback_leaves_the_model_asked_for_and_its_refusals(gw):
    gw.gateway.routes.body["tenants"]["acme"]["models"]["small"]["endpoints"][0]["saturated"] = True
    acme_chat(gw)["endpoints"][0]["saturated"] = True
    shed = gw.chat(headers={"x-priority": "batch"})
    assert shed.status == 503 and shed.json()["error"]["code"] == "overloaded"
    acme_chat(gw).update(
        endpoints=[], unavailable="no healthy region within the tenant's data residency (EU)"
    )
    gw.gateway.routes.body["tenants"]["acme"]["models"]["small"]["endpoints"] = []
    refused = gw.chat()
    assert refused.status == 503 and refused.json()["error"]["code"] == "residency_unavailable"


def test_a_fallback_name_the_tenant_has_no_route_for_is_never_used(gw):
    """Even if a table named one (an older or broken control plane): only this tenant's own routes."""
    globex = gw.gateway.routes.body["tenants"]["globex"]["models"]
    globex["elsewhere"] = {"endpoints": [endpoint(gw.small.url)], "preferred": "us-east-1"}
    acme_chat(gw).update(endpoints=[], unavailable="no healthy region", fallbacks=["elsewhere"])
    assert gw.chat().status == 503 and not gw.small.seen
