"""How a Kubernetes region's engines are reached, and the address the cluster reports for them.

A region's ``exposure`` (in its driver settings: ``{"mode": ..., ...}``) has a ``mode``, one of:

- ``cluster`` (the default): the Service's cluster DNS name. For a gateway that runs inside that cluster.
- ``loadbalancer``: the Service is of type LoadBalancer (``service_annotations`` go on it, e.g. to ask the
  cloud for an internal one); the endpoint is ``http://<address>:8000``, the address the cloud's load
  balancer controller writes in the Service's ``status.loadBalancer.ingress``.
- ``ingress``: an Ingress per workload for the host ``<workload>.<base_domain>`` (``ingress_class``;
  TLS from ``tls_secret``, a certificate for ``*.<base_domain>``, then the endpoint is https); routable
  once the ingress controller reports an address in the Ingress' status.
- ``gateway-api``: an HTTPRoute per workload, the same host, attached to ``gateway``
  (``namespace/name``, whose listener terminates TLS: the endpoint is https); routable once that Gateway
  has accepted the route (``status.parents[].conditions`` Accepted=True).

Until the cluster reports the address, the workload publishes no endpoint, so no gateway routes to it,
and the target says what it waits for. Whatever the mode, the engines refuse a request without their API
key (vLLM's ``--api-key``), so exposing them admits only the gateways, which hold it.
"""

import re
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from core.errors import ValidationFailed

CLUSTER, LOADBALANCER, INGRESS, GATEWAY_API = "cluster", "loadbalancer", "ingress", "gateway-api"
MODES = (CLUSTER, LOADBALANCER, INGRESS, GATEWAY_API)
ROUTE_GROUP, ROUTE_VERSION, ROUTE_PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"
ENGINE_PORT = 8000
_DOMAIN = re.compile(r"(?=.{1,200}$)([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,251}[a-z0-9])?")


@dataclass(frozen=True)
class Exposure:
    mode: str = CLUSTER
    base_domain: str = ""  # ingress, gateway-api: each workload is <workload>.<base_domain>
    gateway: str = ""  # gateway-api: the Gateway's namespace/name
    tls_secret: str = ""  # ingress: the Secret with a certificate for *.<base_domain>
    ingress_class: str = ""  # ingress: the controller's IngressClass ('' the cluster's default)
    service_annotations: dict[str, str] = field(default_factory=dict)  # loadbalancer: e.g. internal

    @classmethod
    def parse(cls, raw: object) -> "Exposure":
        """Raises ValidationFailed naming what is wrong with a region's exposure settings."""
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise ValidationFailed('exposure must be an object, e.g. {"mode": "loadbalancer"}.')
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValidationFailed(f"Unknown exposure setting(s): {', '.join(sorted(map(str, unknown)))}.")
        if raw.get("mode", CLUSTER) not in MODES:
            raise ValidationFailed(f"exposure.mode must be one of {', '.join(MODES)}.")
        texts = {k: v for k, v in raw.items() if k != "service_annotations"}
        if not all(isinstance(v, str) for v in texts.values()):
            raise ValidationFailed("exposure settings other than service_annotations are strings.")
        parsed = cls(**raw)
        parsed._check()
        return parsed

    def _check(self) -> None:
        if self.mode in (INGRESS, GATEWAY_API) and not _DOMAIN.fullmatch(self.base_domain):
            raise ValidationFailed(
                f"exposure mode {self.mode} needs base_domain, a DNS domain (e.g. engines.eu.example.com) "
                "whose names (*.<base_domain>) resolve to the cluster's ingress."
            )
        if self.mode == GATEWAY_API and not self.gateway_ref:
            raise ValidationFailed("exposure mode gateway-api needs gateway: the Gateway's namespace/name.")
        for value, what in ((self.tls_secret, "tls_secret"), (self.ingress_class, "ingress_class")):
            if value and not _NAME.fullmatch(value):
                raise ValidationFailed(f"exposure.{what} must be a Kubernetes object name.")
        annotations = self.service_annotations
        if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and "\x00" not in k + v for k, v in annotations.items()
        ):
            raise ValidationFailed("exposure.service_annotations must map annotation names to strings.")

    @property
    def gateway_ref(self) -> tuple[str, str] | None:
        namespace, _, name = self.gateway.partition("/")
        return (namespace, name) if _NAME.fullmatch(namespace) and _NAME.fullmatch(name) else None

    @property
    def service_type(self) -> str:
        return "LoadBalancer" if self.mode == LOADBALANCER else "ClusterIP"

    def host(self, workload: str) -> str:
        return f"{workload}.{self.base_domain}"

    def route(self, workload: str, service: str, meta: dict[str, Any]) -> dict[str, Any] | None:
        """The Ingress or HTTPRoute that reaches a workload's Service from outside (None: the mode has
        none)."""
        name = self.host(workload)
        if self.mode == INGRESS:
            backend = {"service": {"name": service, "port": {"number": ENGINE_PORT}}}
            path = {"path": "/", "pathType": "Prefix", "backend": backend}
            spec: dict[str, Any] = {"rules": [{"host": name, "http": {"paths": [path]}}]}
            if self.ingress_class:
                spec["ingressClassName"] = self.ingress_class
            if self.tls_secret:
                spec["tls"] = [{"hosts": [name], "secretName": self.tls_secret}]
            return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": spec}
        if self.mode == GATEWAY_API:
            namespace, gateway_name = self.gateway_ref or ("", "")
            # A streamed answer can take minutes: no request timeout at the Gateway (the gateway calling it
            # keeps its own first-byte and idle timeouts).
            rule = {"backendRefs": [{"name": service, "port": ENGINE_PORT}], "timeouts": {"request": "0s"}}
            return {
                "apiVersion": f"{ROUTE_GROUP}/{ROUTE_VERSION}",
                "kind": "HTTPRoute",
                "metadata": meta,
                "spec": {
                    "parentRefs": [{"name": gateway_name, "namespace": namespace}],
                    "hostnames": [name],
                    "rules": [rule],
                },
            }
        return None

    def endpoint(
        self, api: client.ApiClient, namespace: str, workload: str, service: str, timeout: Any
    ) -> str:
        """The URL a gateway calls, '' while the cluster has not reported the address yet."""
        if self.mode == CLUSTER:
            return f"http://{service}.{namespace}.svc.cluster.local:{ENGINE_PORT}"
        if self.mode == LOADBALANCER:
            found = client.CoreV1Api(api).read_namespaced_service(
                service, namespace, _request_timeout=timeout
            )
            address = load_balancer_address(found.status)
            return f"http://{address}:{ENGINE_PORT}" if address else ""
        route = _read_route(api, self.mode, namespace, workload, timeout)
        if self.mode == INGRESS:
            reported = route is not None and load_balancer_address(route.status)
            return f"{'https' if self.tls_secret else 'http'}://{self.host(workload)}" if reported else ""
        return f"https://{self.host(workload)}" if route is not None and route_accepted(route) else ""

    def endpoints(
        self, api: client.ApiClient, namespace: str, selector: str, workloads: list[str], timeout: Any
    ) -> dict[str, str]:
        """``endpoint`` of many workloads at once, from one LIST of the mode's objects (none in cluster
        mode): workload → URL, '' while its address is not reported."""
        if self.mode == CLUSTER:
            return {w: self.endpoint(api, namespace, w, service_name(w), timeout) for w in workloads}
        if self.mode == LOADBALANCER:
            listed = client.CoreV1Api(api).list_namespaced_service(
                namespace, label_selector=selector, _request_timeout=timeout
            )
            address = {_instance(s): load_balancer_address(s.status) for s in listed.items}
            return {w: f"http://{address[w]}:{ENGINE_PORT}" if address.get(w) else "" for w in workloads}
        if self.mode == INGRESS:
            ingresses = client.NetworkingV1Api(api).list_namespaced_ingress(
                namespace, label_selector=selector, _request_timeout=timeout
            )
            scheme = "https" if self.tls_secret else "http"
            reported = {_instance(i) for i in ingresses.items if load_balancer_address(i.status)}
        else:
            routes: Any = client.CustomObjectsApi(api).list_namespaced_custom_object(
                ROUTE_GROUP,
                ROUTE_VERSION,
                namespace,
                ROUTE_PLURAL,
                label_selector=selector,
                _request_timeout=timeout,
            )
            scheme = "https"
            reported = {r["metadata"]["labels"].get(INSTANCE) for r in routes["items"] if route_accepted(r)}
        return {w: f"{scheme}://{self.host(w)}" if w in reported else "" for w in workloads}

    def waiting_for(self) -> str:
        """What a workload without an endpoint waits for."""
        return {
            LOADBALANCER: "waiting for the cloud's load balancer to report the Service's address",
            INGRESS: "waiting for the ingress controller to report the Ingress' address",
            GATEWAY_API: f"waiting for the Gateway {self.gateway} to accept the HTTPRoute",
        }.get(self.mode, "")

    def apply_route(self, api: client.ApiClient, route: dict[str, Any], options: dict[str, Any]) -> None:
        meta = route["metadata"]
        if route["kind"] == "Ingress":
            client.NetworkingV1Api(api).patch_namespaced_ingress(
                meta["name"], meta["namespace"], route, **options
            )
        else:
            client.CustomObjectsApi(api).patch_namespaced_custom_object(
                ROUTE_GROUP, ROUTE_VERSION, meta["namespace"], ROUTE_PLURAL, meta["name"], route, **options
            )


SERVICE_SUFFIX = "-engine"


def service_name(workload: str) -> str:
    # Never "vllm": Kubernetes would inject VLLM_PORT=tcp://… and vLLM reads VLLM_PORT as its own setting.
    return f"{workload}{SERVICE_SUFFIX}"


def workload_of_service(service: str) -> str:
    """The workload (``app.kubernetes.io/instance`` of its pods) whose Service this is."""
    return service.removesuffix(SERVICE_SUFFIX)


INSTANCE = "app.kubernetes.io/instance"  # on every object of a workload: its name


def _instance(obj: Any) -> str:
    return str((obj.metadata.labels or {}).get(INSTANCE, ""))


def load_balancer_address(status: Any) -> str:
    """The first address (IP or hostname) a load balancer controller reported in a Service's or an
    Ingress' ``status.loadBalancer`` ('' while there is none)."""
    balancer = status.load_balancer if status is not None else None
    for entry in (balancer.ingress if balancer is not None else None) or []:
        if entry.ip or entry.hostname:
            return str(entry.ip or entry.hostname)
    return ""


def route_accepted(route: dict[str, Any]) -> bool:
    """Whether a Gateway has accepted the HTTPRoute (a parent's Accepted condition is True)."""
    parents = (route.get("status") or {}).get("parents") or []
    return any(
        c.get("type") == "Accepted" and c.get("status") == "True"
        for parent in parents
        for c in parent.get("conditions") or []
    )


def _read_route(api: client.ApiClient, mode: str, namespace: str, name: str, timeout: Any) -> Any | None:
    """The workload's Ingress (a model) or HTTPRoute (a dict), None when it is not there."""
    try:
        if mode == INGRESS:
            return client.NetworkingV1Api(api).read_namespaced_ingress(
                name, namespace, _request_timeout=timeout
            )
        return client.CustomObjectsApi(api).get_namespaced_custom_object(
            ROUTE_GROUP, ROUTE_VERSION, namespace, ROUTE_PLURAL, name, _request_timeout=timeout
        )
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def delete_routes(api: client.ApiClient, namespace: str, name: str, body: Any, timeout: Any) -> None:
    """Removes the workload's Ingress and HTTPRoute, whichever exist (a region may have changed modes)."""
    removals = (
        lambda: client.NetworkingV1Api(api).delete_namespaced_ingress(
            name, namespace, body=body, _request_timeout=timeout
        ),
        lambda: client.CustomObjectsApi(api).delete_namespaced_custom_object(
            ROUTE_GROUP, ROUTE_VERSION, namespace, ROUTE_PLURAL, name, body=body, _request_timeout=timeout
        ),
    )
    for remove in removals:
        try:
            remove()
        except client.ApiException as exc:
            if exc.status != 404:
                raise
