"""The route table for gateways of your own: Envoy v3 clusters (checked by Envoy's own schema, as
envoy-data-plane generates it from envoyproxy/data-plane-api) and Kubernetes Gateway API HTTPRoutes
(checked by the v1 HTTPRoute CRD's schema): tiers as Envoy priorities, a rollout's split in the weights, a
shadow candidate never a backend, an unavailable route with no backend; each tenant gets only its own."""

import pytest
import yaml
from envoy_data_plane.envoy.config.cluster.v3 import Cluster

from gateway import contract
from routing import services
from routing.exports import envoy, gateway_api
from tests.support.kube_schemas import http_route_errors

SVC = "http://chat-{}.llm-{}.svc.cluster.local:8000"


def endpoint(url: str, region: str, priority: int, track: str = contract.STABLE) -> dict:  # type: ignore[type-arg]
    return {
        "url": url,
        "region": region,
        "priority": priority,
        "weight": 100,
        "deployment": 1,
        "version": "m@2" if track == contract.CANDIDATE else "m@1",
        "served_model": "m",
        "artifact_sha256": "",
        "shared": False,
        "track": track,
    }


def table() -> dict:  # type: ignore[type-arg]
    chat = {
        "endpoints": [
            endpoint(SVC.format("a", "eu"), "eu-west-1", 0),
            endpoint(SVC.format("b", "eu"), "eu-west-1", 0, contract.CANDIDATE),
            endpoint("http://10.0.0.7:8001", "eu-central-1", 1),  # a process region: no Service
        ],
        "preferred": "eu-west-1",
        "splits": {"eu-west-1": {"candidate": 25, "mirror": 0}},
    }
    shadowed = {
        "endpoints": [
            endpoint(SVC.format("c", "eu"), "eu-west-1", 0),
            endpoint(SVC.format("d", "eu"), "eu-west-1", 0, contract.CANDIDATE),
        ],
        "preferred": "eu-west-1",
        "splits": {"eu-west-1": {"candidate": 0, "mirror": 50}},
    }
    down = {
        "endpoints": [],
        "preferred": "",
        "unavailable": "no healthy region within the tenant's residency",
    }
    return {
        "acme": {"limits": {}, "blocked": "", "models": {"chat": chat, "shadowed": shadowed, "down": down}}
    }


def test_envoy_clusters_are_valid_envoy_and_keep_the_tables_order_and_split():
    with pytest.raises(KeyError):  # the schema is strict: a misspelt field is refused, not dropped
        Cluster.from_dict({"name": "x", "load_assigment": {}})
    exported = envoy(table(), 7)
    assert exported["version_info"] == "7"
    clusters = {}
    for resource in exported["resources"]:
        kind = resource.pop("@type")
        assert kind == "type.googleapis.com/envoy.config.cluster.v3.Cluster"
        clusters[resource["name"]] = Cluster.from_dict(resource)  # refuses unknown fields and bad types
    chat = clusters["acme__chat"].load_assignment.endpoints
    assert [level.priority for level in chat] == [0, 1]
    weights = {
        e.endpoint.address.socket_address.address: e.load_balancing_weight for e in chat[0].lb_endpoints
    }
    assert weights == {"chat-a.llm-eu.svc.cluster.local": 7500, "chat-b.llm-eu.svc.cluster.local": 2500}
    assert chat[1].lb_endpoints[0].endpoint.address.socket_address.port_value == 8001
    shadowed = clusters["acme__shadowed"].load_assignment.endpoints
    assert [e.endpoint.address.socket_address.address for e in shadowed[0].lb_endpoints] == [
        "chat-c.llm-eu.svc.cluster.local"
    ]
    assert not clusters["acme__down"].load_assignment.endpoints  # fail closed: Envoy answers 503


def test_http_routes_are_valid_gateway_api_and_name_only_services_of_the_first_tier():
    routes = {r["metadata"]["name"]: r for r in gateway_api(table(), 7, "llm-gateway", "tenants")}
    for route in routes.values():
        assert http_route_errors(route) == [], route
    (rule,) = routes["acme-chat"]["spec"]["rules"]
    assert {b["name"]: b["weight"] for b in rule["backendRefs"]} == {"chat-a": 7500, "chat-b": 2500}
    assert {b["namespace"] for b in rule["backendRefs"]} == {"llm-eu"}
    headers = {h["name"]: h["value"] for h in rule["matches"][0]["headers"]}
    assert headers == {"x-tenant": "acme", "x-model": "chat"}
    assert [b["name"] for b in routes["acme-shadowed"]["spec"]["rules"][0]["backendRefs"]] == ["chat-c"]
    assert routes["acme-down"]["spec"]["rules"][0]["backendRefs"] == []


@pytest.mark.django_db
def test_each_caller_exports_only_its_own_routes_and_bad_parameters_are_400(world, api):
    services.publish()
    for path in ("envoy/", "gateway-api/"):
        assert api(world.alice).get(f"/api/v1/routing/export/{path}").status_code == 200
        assert api().get(f"/api/v1/routing/export/{path}").status_code == 401
    envoy_of_bob = api(world.bob).get("/api/v1/routing/export/envoy/").json()
    assert all(not c["name"].startswith(f"{world.tenant_a.slug}__") for c in envoy_of_bob["resources"])
    routes = list(yaml.safe_load_all(api(world.bob).get("/api/v1/routing/export/gateway-api/").content))
    assert all(
        r["spec"]["rules"][0]["matches"][0]["headers"][0]["value"] != world.tenant_a.slug for r in routes
    )
    for bad in ("Upper", "a_b", "x" * 70, "-x", "a\x00b", "../etc"):
        reply = api(world.alice).get("/api/v1/routing/export/gateway-api/", {"gateway": bad})
        assert reply.status_code == 400 and set(reply.json()) == {"error"}
