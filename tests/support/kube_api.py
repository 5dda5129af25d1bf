"""A small Kubernetes API server for tests and benchmarks: the real REST protocol over HTTP.

It keeps Deployments, Services and Pods, Secrets, PodDisruptionBudgets, HorizontalPodAutoscalers
(autoscaling/v2), Ingresses, and the custom resources KEDA's ScaledObjects and Gateway API's HTTPRoutes in
memory and answers the calls the official client makes: server-side apply (PATCH
application/apply-patch+yaml with fieldManager), merge patches (what ``kubectl scale`` and an HPA's
controller send), GET, LIST with label selectors, DELETE, with complete objects (uid, resourceVersion,
generation, status) since client 37 validates responses. Of server-side apply's field ownership it keeps
what scaling hands over: the first applier owns an object and a later one only the fields it sends, and
a Deployment's ``replicas`` follow the rules (an apply that drops them while nobody else owns them resets
them to the default 1; a different value over another manager's is a 409 unless forced; an update takes
them over). KEDA's admission webhook is there too: no ScaledObject for a workload an HPA scales.

A Deployment becomes ready as soon as it is applied, unless the test holds it or injects a pod problem.
Its generation grows with every spec change; a test can keep the Deployment controller from acting on one
(``lagging``: status and pods stay those of the template it last rolled out) and set status fields itself
(``status_overrides``: observedGeneration, replicas, updatedReplicas, readyReplicas, conditions). Every
request is logged, so a test can assert that a no-op reconcile pass wrote nothing. What other controllers
write in a status (a cloud load balancer's address, an ingress controller's, a Gateway accepting a route)
a test sets in ``reported``.
"""

import argparse
import copy
import json
import re
import sys
import threading
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import yaml

PATH = re.compile(
    r"^/(?:api/v1|apis/apps/v1|apis/autoscaling/v2|apis/policy/v1|apis/keda\.sh/v1alpha1"
    r"|apis/networking\.k8s\.io/v1|apis/gateway\.networking\.k8s\.io/v1)/namespaces/(?P<ns>[^/]+)/"
    r"(?P<kind>deployments|services|secrets|pods|poddisruptionbudgets|horizontalpodautoscalers|scaledobjects"
    r"|ingresses|httproutes)"
    r"(?:/(?P<name>[^/?]+))?"
)
KINDS = {
    "deployments": ("apps/v1", "Deployment"),
    "services": ("v1", "Service"),
    "secrets": ("v1", "Secret"),
    "poddisruptionbudgets": ("policy/v1", "PodDisruptionBudget"),
    "pods": ("v1", "Pod"),
    "horizontalpodautoscalers": ("autoscaling/v2", "HorizontalPodAutoscaler"),
    "scaledobjects": ("keda.sh/v1alpha1", "ScaledObject"),
    "ingresses": ("networking.k8s.io/v1", "Ingress"),
    "httproutes": ("gateway.networking.k8s.io/v1", "HTTPRoute"),
}
# The status an object has until a controller reports something (a load balancer's address, a Gateway
# accepting a route): what ``reported`` overrides.
EMPTY_STATUS = {
    "Service": {"loadBalancer": {}},
    "Ingress": {"loadBalancer": {}},
    "HTTPRoute": {"parents": []},
}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _started_pod(created: str) -> dict[str, Any]:
    """A running pod's status: scheduled at creation, weights fetched 42 s later, engine Ready 70 s after that
    (what a kubelet reports; the driver derives the replica's cold-start timing from it)."""
    at = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)

    def stamp(seconds: int) -> str:
        return (at + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")

    return {
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(0)},
            {"type": "Initialized", "status": "True", "lastTransitionTime": stamp(42)},
            {"type": "Ready", "status": "True", "lastTransitionTime": stamp(112)},
        ],
        "initContainerStatuses": [
            {
                "name": "fetch-model",
                "ready": True,
                "restartCount": 0,
                "image": "amazon/aws-cli:2.17.0",
                "imageID": "",
                "state": {"terminated": {"exitCode": 0, "finishedAt": stamp(42), "reason": "Completed"}},
            }
        ],
    }


class Objects(dict[tuple[str, str, str], dict[str, Any]]):
    """(kind, namespace, name) → object, also indexed by (kind, namespace): a listing reads its own kind
    and namespace, not every object (at thousands of workloads a scan per request would time this server,
    not the client calling it)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_place: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)

    def __setitem__(self, key: tuple[str, str, str], value: dict[str, Any]) -> None:
        super().__setitem__(key, value)
        self.by_place[key[:2]][key[2]] = value

    def pop(self, key: tuple[str, str, str], *default: Any) -> Any:  # type: ignore[override]
        self.by_place[key[:2]].pop(key[2], None)
        return super().pop(key, *default)

    def listing(self, kind: str, ns: str) -> list[dict[str, Any]]:
        return list(self.by_place[(kind, ns)].values())


def selected(labels: dict[str, str], selector: str) -> bool:
    """Whether labels match an equality-based label selector (``a=b,c=d``)."""
    wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
    return all(labels.get(k) == v for k, v in wanted.items())


class KubeState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects = Objects()
        self.requests: list[tuple[str, str]] = []
        self.held: set[str] = set()  # deployments that must not become ready
        self.pod_problems: dict[str, dict[str, Any]] = {}  # deployment name → waiting state
        self.down = False  # when set, every connection is dropped without an answer (a network failure)
        self.lagging: set[str] = set()  # deployments whose controller has not acted on the latest change
        self.status_overrides: dict[str, dict[str, Any]] = {}  # deployment name → status fields
        self.rolled_out: dict[str, dict[str, Any]] = {}  # name → template labels and status last rolled out
        self.appliers: dict[tuple[str, str, str], str] = {}  # the field manager that applied it first
        self.replica_owners: dict[str, set[str]] = {}  # deployment name → managers owning spec.replicas
        self.reported: dict[tuple[str, str], dict[str, Any]] = {}  # (kind, name) → status a controller wrote

    def apply_replicas(
        self, name: str, manager: str, force: bool, current: dict[str, Any] | None, sent: dict[str, Any]
    ) -> tuple[int | None, str]:
        """(replicas after this apply of a Deployment, or a conflict's message)."""
        owners = self.replica_owners.setdefault(name, set())
        have = (current or {}).get("spec", {}).get("replicas")
        if "replicas" not in sent.get("spec", {}):
            owners.discard(manager)
            return (have if owners else 1), ""  # unowned, the field goes and defaulting sets 1
        want = sent["spec"]["replicas"]
        others = owners - {manager}
        if have is not None and want != have and others and not force:
            return None, f'Apply failed with 1 conflict: conflict with "{min(others)}": .spec.replicas'
        self.replica_owners[name] = owners | {manager} if want == have else {manager}
        return want, ""

    def admission(self, kind: str, ns: str, body: dict[str, Any]) -> str:
        """KEDA's webhook refuses a ScaledObject whose workload an HPA already scales."""
        target = body.get("spec", {}).get("scaleTargetRef", {}).get("name")
        if kind != "scaledobjects":
            return ""
        for (other, other_ns, name), obj in self.objects.items():
            scales = other == "horizontalpodautoscalers" and obj["spec"]["scaleTargetRef"]["name"] == target
            if scales and other_ns == ns:
                return f"the workload '{target}' of the ScaledObject is already managed by the hpa '{name}'"
        return ""

    def writes(self) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[0] in {"PATCH", "PUT", "POST", "DELETE"}]

    def refresh_status(self, obj: dict[str, Any]) -> None:
        if obj["kind"] == "Deployment":
            name = obj["metadata"]["name"]
            if name not in self.lagging or name not in self.rolled_out:
                labels = obj["spec"].get("template", {}).get("metadata", {}).get("labels", {})
                self.rolled_out[name] = {"labels": labels, "status": self._deployment_status(obj)}
            status = copy.deepcopy(self.rolled_out[name]["status"])
            obj["status"] = {**status, **self.status_overrides.get(name, {})}
        elif obj["kind"] in EMPTY_STATUS:
            if obj["kind"] == "Service":
                obj["spec"].setdefault("clusterIP", "10.96.0.10")
            name = obj["metadata"]["name"]
            obj["status"] = copy.deepcopy(self.reported.get((obj["kind"], name), EMPTY_STATUS[obj["kind"]]))

    def _deployment_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        name, want = obj["metadata"]["name"], obj["spec"].get("replicas", 1)
        ready = 0 if name in self.held or name in self.pod_problems else want
        return {
            "observedGeneration": obj["metadata"]["generation"],
            "replicas": want,
            "updatedReplicas": want,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": [
                {
                    "type": "Available",
                    "status": "True" if ready >= want else "False",
                    "lastUpdateTime": _now(),
                    "lastTransitionTime": _now(),
                    "reason": "MinimumReplicasAvailable",
                    "message": "",
                }
            ],
        }

    def pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        """One pod per replica the controller last rolled out, labelled from the template it rolled out."""
        instance = dict(part.split("=", 1) for part in selector.split(",") if "=" in part).get(
            "app.kubernetes.io/instance"
        )
        if instance is None:
            deployments = self.objects.listing("deployments", ns)
        else:  # a workload's pods: its Deployment is named after it
            deployments = [d for d in [self.objects.get(("deployments", ns, instance))] if d]
        pods = []
        for obj in deployments:
            name = obj["metadata"]["name"]
            seen = self.rolled_out.get(name, {})
            labels = seen.get("labels") or obj["metadata"].get("labels", {})
            if not selected(labels, selector):
                continue
            count = max(1, seen.get("status", {}).get("replicas", 1))
            pods += [self._pod(ns, name, obj, labels, index) for index in range(count)]
        return pods

    def _pod(
        self, ns: str, name: str, obj: dict[str, Any], labels: dict[str, str], index: int
    ) -> dict[str, Any]:
        waiting = self.pod_problems.get(name)
        status: dict[str, Any] = {"phase": "Pending" if waiting else "Running", "conditions": []}
        if not waiting and name not in self.held:
            status.update(_started_pod(obj["metadata"]["creationTimestamp"]))
        if waiting and waiting.get("reason") == "Unschedulable":
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": waiting.get("message", ""),
                }
            ]
        elif waiting:
            status["containerStatuses"] = [
                {
                    "name": "vllm",
                    "ready": False,
                    "restartCount": 3,
                    "image": "x",
                    "imageID": "",
                    "state": {"waiting": waiting},
                }
            ]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "status": status,
            "metadata": {
                "name": f"{name}-abc1{index}",
                "namespace": ns,
                "labels": labels,
                "uid": str(uuid.uuid4()),
            },
            "spec": {"containers": [{"name": "vllm", "image": "x"}]},
        }


class Handler(BaseHTTPRequestHandler):
    state: KubeState
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small JSON answers: without it each waits ~40 ms for delayed ACKs

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(
            code,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": message,
                "reason": reason,
                "code": code,
            },
        )

    def _dropped(self) -> bool:
        if self.state.down:
            self.close_connection = True
        return self.state.down

    def _route(self) -> tuple[str, str, str | None, dict[str, str]] | None:
        path, _, query = self.path.partition("?")
        match = PATH.match(path)
        if not match:
            return None
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        return match["ns"], match["kind"], match["name"], params

    def do_GET(self) -> None:
        if self._dropped():
            return None
        if self.path == "/_requests":  # the benchmark's count, when this server runs in its own process
            return self._send(200, {"total": len(self.state.requests), "writes": len(self.state.writes())})
        self.state.requests.append(("GET", self.path))
        route = self._route()
        if route is None:
            return self._status(404, "NotFound", "no such path")
        ns, kind, name, params = route
        with self.state.lock:
            if name is None:
                selector = unquote(params.get("labelSelector", ""))
                items = self.state.pods(ns, selector)
                if kind != "pods":
                    items = [
                        o
                        for o in self.state.objects.listing(kind, ns)
                        if selected(o["metadata"].get("labels", {}), selector)
                    ]
                    for item in items:
                        self.state.refresh_status(item)
                api_version, object_kind = KINDS[kind]
                return self._send(
                    200,
                    {
                        "apiVersion": api_version,
                        "kind": f"{object_kind}List",
                        "metadata": {"resourceVersion": "1"},
                        "items": items,
                    },
                )
            obj = self.state.objects.get((kind, ns, name))
            if obj is None:
                return self._status(404, "NotFound", f'{kind} "{name}" not found')
            self.state.refresh_status(obj)
            return self._send(200, obj)

    def do_PATCH(self) -> None:
        if self._dropped():
            return None
        self.state.requests.append(("PATCH", self.path))
        route = self._route()
        if route is None or route[2] is None:
            return self._status(404, "NotFound", "no such path")
        ns, kind, name, params = route[0], route[1], route[2], route[3]
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}"
        try:
            body = json.loads(raw)  # what the official client sends, even as apply-patch+yaml
        except ValueError:
            body = yaml.safe_load(raw)
        content_type = self.headers.get("Content-Type", "")
        with self.state.lock:
            current = self.state.objects.get((kind, ns, name))
            if content_type.startswith("application/apply-patch"):
                manager = params.get("fieldManager")
                if not manager:
                    return self._status(400, "BadRequest", "fieldManager is required for apply patch")
                denied = self.state.admission(kind, ns, body)
                if denied:
                    return self._status(403, "Forbidden", f"admission webhook denied the request: {denied}")
                updated = self._apply(kind, ns, name, current, body, manager)
                if kind == "deployments":
                    force = params.get("force") == "true"
                    replicas, conflict = self.state.apply_replicas(name, manager, force, current, body)
                    if conflict:
                        return self._status(409, "Conflict", conflict)
                    updated["spec"]["replicas"] = replicas
            elif current is None:
                return self._status(404, "NotFound", f'{kind} "{name}" not found')
            else:
                updated = merge_patch(current, body)
                rescaled = updated["spec"].get("replicas") != current["spec"].get("replicas")
                if kind == "deployments" and rescaled:  # an update takes the field over
                    self.state.replica_owners[name] = {params.get("fieldManager", "scaler")}
            if current is None or updated.get("spec") != current.get("spec"):
                updated["metadata"]["generation"] = (current or {}).get("metadata", {}).get(
                    "generation", 0
                ) + 1
            updated["metadata"]["resourceVersion"] = str(len(self.state.requests))
            self.state.objects[(kind, ns, name)] = updated
            self.state.refresh_status(updated)
            return self._send(201 if current is None else 200, updated)

    def _apply(
        self,
        kind: str,
        ns: str,
        name: str,
        current: dict[str, Any] | None,
        body: dict[str, Any],
        manager: str,
    ) -> dict[str, Any]:
        meta = {**(current or {}).get("metadata", {}), **body.get("metadata", {})}
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta.update(name=name, namespace=ns)
        spec = copy.deepcopy(body.get("spec", {}))
        first = self.state.appliers.setdefault((kind, ns, name), manager)
        if current is not None and manager != first:  # a later manager owns only the fields it sends
            spec = merge_patch(current.get("spec", {}), spec)
        return {**body, "metadata": meta, "spec": spec}

    def do_DELETE(self) -> None:
        if self._dropped():
            return None
        self.state.requests.append(("DELETE", self.path))
        self.rfile.read(int(self.headers.get("Content-Length", 0)))  # DeleteOptions
        route = self._route()
        if route is None or route[2] is None:
            return self._status(404, "NotFound", "no such path")
        ns, kind, name = route[0], route[1], route[2]
        with self.state.lock:
            removed = self.state.objects.pop((kind, ns, name), None)
            self.state.appliers.pop((kind, ns, name), None)
            if kind == "deployments":
                self.state.rolled_out.pop(name, None)
                self.state.replica_owners.pop(name, None)
        if removed is None:
            return self._status(404, "NotFound", f'{kind} "{name}" not found')
        if kind == "services":  # the API answers a Service deletion with the object, others with a Status
            return self._send(200, removed)
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        return self._send(200, {**status, "details": {"name": name, "kind": kind}})


def kubeconfig(url: str) -> dict[str, Any]:
    """A kubeconfig for the server at ``url`` (a bearer token it does not check)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": url}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
    }


class KubeApiServer:
    def __init__(self, port: int = 0) -> None:
        self.state = KubeState()
        handler = type("BoundHandler", (Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "KubeApiServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self) -> dict[str, Any]:
        return kubeconfig(self.url)


def main() -> None:
    """Serves in a process of its own (the reconcile benchmark's cluster): prints its URL, until killed."""
    parser = argparse.ArgumentParser(description="A Kubernetes API test server.")
    parser.add_argument("--port", type=int, default=0)
    port = parser.parse_args().port
    server = KubeApiServer(port)
    print(server.url, flush=True)
    sys.stdout.close()
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
