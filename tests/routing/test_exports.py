"""The route table for gateways of your own: Envoy v3 clusters (checked by Envoy's own schema, as
envoy-data-plane generates it from envoyproxy/data-plane-api) and Kubernetes Gateway API HTTPRoutes
(checked by the v1 HTTPRoute CRD's schema): tiers as Envoy priorities, a rollout's split in the weights, a
shadow candidate never a backend, an unavailable route with no backend; each tenant gets only its own."""

import pytest
import yaml
from envoy_data_plane.envoy.config.cluster.v3 import Cluster

from gateway import contract
from regions.drivers.kubernetes_exposure import service_name, workload_of_service
from routing import services
from routing.exports import envoy, gateway_api
from tests.support.kube_schemas import http_route_errors, inference_pool_errors

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
    exported = envoy(table(), 7, "eu-west-1")
    assert exported["version_info"] == "7"
    clusters = {}
    for resource in exported["resources"]:
        kind = resource.pop("@type")
        assert kind == "type.googleapis.com/envoy.config.cluster.v3.Cluster"
        clusters[resource["name"]] = Cluster.from_dict(resource)  # refuses unknown fields and bad types
    chat = clusters["acme/chat"].load_assignment.endpoints
    assert [level.priority for level in chat] == [0, 1]
    weights = {
        e.endpoint.address.socket_address.address: e.load_balancing_weight for e in chat[0].lb_endpoints
    }
    assert weights == {"chat-a.llm-eu.svc.cluster.local": 7500, "chat-b.llm-eu.svc.cluster.local": 2500}
    assert chat[1].lb_endpoints[0].endpoint.address.socket_address.port_value == 8001
    shadowed = clusters["acme/shadowed"].load_assignment.endpoints
    assert [e.endpoint.address.socket_address.address for e in shadowed[0].lb_endpoints] == [
        "chat-c.llm-eu.svc.cluster.local"
    ]
    assert not clusters["acme/down"].load_assignment.endpoints  # fail closed: Envoy answers 503
    # For another cluster, this region's Service names would resolve to that cluster's own copies: left out.
    elsewhere = {c["name"]: c for c in envoy(table(), 7, "eu-central-1")["resources"]}
    (level,) = elsewhere["acme/chat"]["load_assignment"]["endpoints"]
    assert [e["endpoint"]["address"]["socket_address"]["address"] for e in level["lb_endpoints"]] == [
        "10.0.0.7"
    ]


def test_http_routes_are_valid_gateway_api_and_name_only_services_of_the_first_tier():
    exported = gateway_api(table(), 7, "llm-gateway", "tenants", "eu-west-1")
    routes = {r["metadata"]["name"].rsplit("-", 1)[0]: r for r in exported}
    for route in routes.values():
        assert http_route_errors(route) == [], route
    (rule,) = routes["acme-chat"]["spec"]["rules"]
    assert {b["name"]: b["weight"] for b in rule["backendRefs"]} == {"chat-a": 7500, "chat-b": 2500}
    assert {b["namespace"] for b in rule["backendRefs"]} == {"llm-eu"}
    headers = {h["name"]: h["value"] for h in rule["matches"][0]["headers"]}
    assert headers == {"x-tenant": "acme", "x-model": "chat"}
    assert [b["name"] for b in routes["acme-shadowed"]["spec"]["rules"][0]["backendRefs"]] == ["chat-c"]
    assert routes["acme-down"]["spec"]["rules"][0]["backendRefs"] == []
    other_cluster = gateway_api(table(), 7, "llm-gateway", "tenants", "eu-central-1")
    assert all(r["spec"]["rules"][0]["backendRefs"] == [] for r in other_cluster)  # never eu-west-1's names


def test_where_the_cluster_runs_the_inference_extension_routes_are_backed_by_valid_inference_pools():
    exported = gateway_api(table(), 7, "llm-gateway", "tenants", "eu-west-1", inference_pools=True)
    routes = [d for d in exported if d["kind"] == "HTTPRoute"]
    pools = {d["metadata"]["name"]: d for d in exported if d["kind"] == "InferencePool"}
    assert all(http_route_errors(r) == [] for r in routes)
    assert all(inference_pool_errors(p) == [] for p in pools.values()), [
        inference_pool_errors(p) for p in pools.values()
    ]
    (rule,) = next(r for r in routes if r["metadata"]["name"].startswith("acme-chat-"))["spec"]["rules"]
    refs = {b["name"]: (b["kind"], b["group"], b["weight"]) for b in rule["backendRefs"]}
    assert refs == {
        "chat-a": ("InferencePool", "inference.networking.k8s.io", 7500),
        "chat-b": ("InferencePool", "inference.networking.k8s.io", 2500),
    }
    assert sorted(pools) == ["chat-a", "chat-b", "chat-c"]  # a shadow candidate is never a backend
    spec = pools["chat-a"]["spec"]
    assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/instance": "chat-a"}
    assert workload_of_service(service_name("chat-eu")) == "chat-eu"  # what our driver's Services are named
    assert spec["targetPorts"] == [{"number": 8000}]
    assert spec["endpointPickerRef"] == {
        "name": "chat-a-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    assert pools["chat-a"]["metadata"]["namespace"] == "llm-eu"


def test_export_names_never_collide():
    one = {"models": {"eu-llama": {"endpoints": [], "preferred": ""}}, "limits": {}, "blocked": ""}
    two = {"models": {"llama": {"endpoints": [], "preferred": ""}}, "limits": {}, "blocked": ""}
    tenants = {"acme": one, "acme-eu": two}
    names = [r["metadata"]["name"] for r in gateway_api(tenants, 1, "gw", "default", "eu-west-1")]
    assert len(set(names)) == 2 and all(len(n) <= 63 for n in names)
    assert len({c["name"] for c in envoy(tenants, 1)["resources"]}) == 2


@pytest.mark.django_db
def test_each_caller_exports_only_its_own_routes_and_bad_parameters_are_400(world, api, make_region):
    services.publish()
    make_region("eu-west-1", "EU")
    for path in (
        "envoy/",
        "gateway-api/?region=eu-west-1",
        "gateway-api/?region=eu-west-1&inference_pools=1",
    ):
        assert api(world.alice).get(f"/api/v1/routing/export/{path}").status_code == 200
        assert api().get(f"/api/v1/routing/export/{path}").status_code == 401
    envoy_of_bob = api(world.bob).get("/api/v1/routing/export/envoy/").json()
    assert all(not c["name"].startswith(f"{world.tenant_a.slug}/") for c in envoy_of_bob["resources"])
    reply = api(world.bob).get("/api/v1/routing/export/gateway-api/", {"region": "eu-west-1"})
    routes = list(yaml.safe_load_all(reply.content))
    assert all(
        r["spec"]["rules"][0]["matches"][0]["headers"][0]["value"] != world.tenant_a.slug for r in routes
    )
    for bad in ("Upper", "a_b", "x" * 70, "-x", "a\x00b", "../etc"):
        reply = api(world.alice).get(
            "/api/v1/routing/export/gateway-api/", {"gateway": bad, "region": "eu-west-1"}
        )
        assert reply.status_code == 400 and set(reply.json()) == {"error"}
    pools = {"region": "eu-west-1", "inference_pools": "yes"}
    assert api(world.alice).get("/api/v1/routing/export/gateway-api/", pools).status_code == 400
    for region in ({}, {"region": "mars-1"}):  # Service names resolve only inside their cluster: say which
        assert api(world.alice).get("/api/v1/routing/export/gateway-api/", region).status_code == 400
