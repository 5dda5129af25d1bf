"""The route table in formats existing gateways consume: nginx upstreams, Envoy clusters and Kubernetes
Gateway API HTTPRoutes (with InferencePools where the cluster runs the Gateway API Inference Extension).
Each is computed from the caller's routes as the table has them, so nothing in an
export can reach a region the table does not offer that tenant."""

import hashlib
import re
from typing import Any

from gateway import contract
from regions.drivers.kubernetes_exposure import workload_of_service


def nginx(tenants: dict[str, contract.TenantRoutes], generation: int) -> str:
    """One upstream per (tenant, model): the first tier as weighted servers, later tiers as ``backup``.

    nginx sends to backup servers only when every primary one is down, which is the table's failover order.
    """
    lines = [f"# route table generation {generation}; regenerate on change (ETag) and reload nginx", ""]
    for slug, view in sorted(tenants.items()):
        for name, route in sorted(view["models"].items()):
            lines.append(f"upstream {slug}__{name} {{")
            if not route["endpoints"]:
                lines.append(f"    # unavailable: {route.get('unavailable', '')}")
                lines.append("    server 127.0.0.1:9 down;  # fail closed: never a region outside residency")
            for endpoint in route["endpoints"]:
                host = endpoint["url"].split("://", 1)[-1]
                backup = " backup" if endpoint["priority"] > 0 else ""
                lines.append(
                    f"    server {host} weight={endpoint['weight']} max_fails=2 fail_timeout=30s{backup};"
                    f"  # {endpoint['region']} {endpoint['version']}"
                )
            lines += ["    keepalive 32;", "}", ""]
    return "\n".join(lines)


def _by_tier(route: contract.Route) -> dict[int, list[contract.Endpoint]]:
    """The route's answering endpoints by tier, a rollout's split applied to their weights (a candidate
    not yet taking traffic, or a shadow one, is left out: it never answers a client)."""
    splits = route.get("splits", {})
    tiers: dict[int, list[contract.Endpoint]] = {}
    for endpoint in route["endpoints"]:
        share = _share(endpoint, splits)
        if share > 0:
            tiers.setdefault(endpoint["priority"], []).append(
                {**endpoint, "weight": endpoint["weight"] * share}
            )
    return tiers


def _share(endpoint: contract.Endpoint, splits: dict[str, contract.Split]) -> int:
    """Percent of its region's requests the endpoint's revision takes."""
    split = splits.get(endpoint["region"])
    if split is None:
        return 0 if endpoint.get("track") == contract.CANDIDATE else 100
    candidate = split["candidate"]
    return candidate if endpoint.get("track") == contract.CANDIDATE else 100 - candidate


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.split("://", 1)[-1].split("/", 1)[0].rpartition(":")
    return (host, int(port)) if host else (port, 80)


def envoy(tenants: dict[str, contract.TenantRoutes], generation: int, region: str = "") -> dict[str, Any]:
    """Envoy v3 clusters, one per (tenant, model), named ``tenant/model``: each tier an Envoy priority level,
    so Envoy fails over in the table's order; within a level, the endpoints' weights (a rollout's split
    applied). A route with no compliant endpoint is a cluster with none: Envoy answers 503, never from
    outside residency. An in-cluster Service name resolves in whichever cluster Envoy runs in, where the
    same name may be another region's copy: such endpoints are exported only for the ``region`` named."""
    clusters = []
    for slug, view in sorted(tenants.items()):
        for name, route in sorted(view["models"].items()):
            cluster_name = f"{slug}/{name}"  # neither a tenant slug nor a model name holds a '/'
            route = _resolvable(route, region)
            levels = [
                {
                    "priority": level,
                    "lb_endpoints": [
                        {
                            "endpoint": {"address": {"socket_address": _socket(e["url"])}},
                            "load_balancing_weight": max(1, e["weight"]),
                            "metadata": {
                                "filter_metadata": {"llm": {"region": e["region"], "version": e["version"]}}
                            },
                        }
                        for e in endpoints
                    ],
                }
                for level, endpoints in enumerate(tiers for _, tiers in sorted(_by_tier(route).items()))
            ]
            clusters.append(
                {
                    "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                    "name": cluster_name,
                    "type": "STRICT_DNS",
                    "connect_timeout": "2s",
                    "lb_policy": "ROUND_ROBIN",
                    "load_assignment": {"cluster_name": cluster_name, "endpoints": levels},
                }
            )
    return {"version_info": str(generation), "resources": clusters}


def _socket(url: str) -> dict[str, Any]:
    host, port = _host_port(url)
    return {"address": host, "port_value": port}


SERVICE_HOST = re.compile(
    r"(?P<service>[a-z0-9-]{1,63})\.(?P<namespace>[a-z0-9-]{1,63})\.svc(\.cluster\.local)?"
)


INFERENCE_GROUP = "inference.networking.k8s.io"
ENDPOINT_PICKER_PORT = 9002  # the Inference Extension's endpoint picker (EPP) listens here by default


def gateway_api(
    tenants: dict[str, contract.TenantRoutes],
    generation: int,
    gateway: str,
    namespace: str,
    region: str,
    inference_pools: bool = False,
) -> list[dict[str, Any]]:
    """Kubernetes Gateway API HTTPRoutes for the cluster of one ``region``, one per (tenant, model),
    matched on the ``x-tenant`` and ``x-model`` headers your gateway sets after authenticating: that
    region's Services of the route's first tier as weighted backends (a rollout's split applied). Service
    names resolve inside their own cluster only, so no other region's endpoint is exported. HTTPRoute has
    no failover order: regenerate on every table change (the ETag). A route left with no backend (the
    first tier elsewhere, or not Services) answers 500, never from another region.

    With ``inference_pools`` (the cluster runs the Gateway API Inference Extension), each backend is an
    ``InferencePool`` instead of a Service: the pool selects that workload's vLLM pods and names its endpoint
    picker (``<pool>-epp``, port 9002, fail closed), which chooses the pod by queue and KV-cache load; the
    pools come after the routes, one per workload however many routes use it."""
    routes, pools = [], {}
    for slug, view in sorted(tenants.items()):
        for name, route in sorted(view["models"].items()):
            tiers = _by_tier({**route, "endpoints": [e for e in route["endpoints"] if e["region"] == region]})
            first = tiers[min(tiers)] if tiers else []
            backends = [_service_backend(e) for e in first]
            if inference_pools:
                for backend in filter(None, backends):
                    pools[(backend["namespace"], backend["name"])] = _pool(backend, generation)
                    backend.update(group=INFERENCE_GROUP, kind="InferencePool")
                    del backend["port"]  # a pool's port is its own (targetPorts)
            rule = {
                "matches": [
                    {
                        "path": {"type": "PathPrefix", "value": "/v1/"},
                        "headers": [{"name": "x-tenant", "value": slug}, {"name": "x-model", "value": name}],
                    }
                ],
                "backendRefs": [b for b in backends if b is not None],
            }
            routes.append(
                {
                    "apiVersion": "gateway.networking.k8s.io/v1",
                    "kind": "HTTPRoute",
                    "metadata": {
                        "name": _object_name(slug, name),
                        "namespace": namespace,
                        "annotations": {"llm-control-plane/route-table-generation": str(generation)},
                    },
                    "spec": {"parentRefs": [{"name": gateway}], "rules": [rule]},
                }
            )
    return routes + [pools[key] for key in sorted(pools)]


def _pool(backend: dict[str, Any], generation: int) -> dict[str, Any]:
    """The InferencePool of one workload's Service: the pods the Service selects (our Kubernetes driver
    labels them with the workload's name: ``app.kubernetes.io/instance``), on the port it forwards to."""
    return {
        "apiVersion": f"{INFERENCE_GROUP}/v1",
        "kind": "InferencePool",
        "metadata": {
            "name": backend["name"],
            "namespace": backend["namespace"],
            "annotations": {"llm-control-plane/route-table-generation": str(generation)},
        },
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/instance": workload_of_service(backend["name"])}},
            "targetPorts": [{"number": backend["port"]}],
            "endpointPickerRef": {
                "name": f"{backend['name']}-epp"[:63],
                "port": {"number": ENDPOINT_PICKER_PORT},
                "failureMode": "FailClose",
            },
        },
    }


def _service_backend(endpoint: contract.Endpoint) -> dict[str, Any] | None:
    host, port = _host_port(endpoint["url"])
    found = SERVICE_HOST.fullmatch(host)
    if found is None:
        return None
    return {
        "name": found["service"],
        "namespace": found["namespace"],
        "port": port,
        "weight": max(1, endpoint["weight"]),
    }


def _object_name(slug: str, name: str) -> str:
    """A Kubernetes object name for (tenant, model), unique however the two read once lower-cased and
    cut to 63 characters: a short hash of the pair ends it."""
    digest = hashlib.blake2b(f"{slug}/{name}".encode(), digest_size=4).hexdigest()
    label = re.sub(r"[^a-z0-9-]+", "-", f"{slug}-{name}".lower()).strip("-")[:54].strip("-")
    return f"{label}-{digest}" if label else f"route-{digest}"


def _resolvable(route: contract.Route, region: str) -> contract.Route:
    """The route without in-cluster Service endpoints of regions other than ``region``."""
    endpoints = [
        e
        for e in route["endpoints"]
        if e["region"] == region or not SERVICE_HOST.fullmatch(_host_port(e["url"])[0])
    ]
    return {**route, "endpoints": endpoints}
