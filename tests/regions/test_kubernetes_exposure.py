"""Reaching a Kubernetes region's engines from outside its cluster: each exposure mode renders manifests
that validate (Kubernetes' schemas, Gateway API's HTTPRoute CRD), a workload is not routable until the
cluster reports its external address, the address it reports is what the route table publishes, and a
bad exposure setting is refused with a message naming it."""

from dataclasses import replace

import pytest
import yaml
from kubernetes import client

from core.errors import ValidationFailed
from regions.drivers.kubernetes import KubernetesConfig, KubernetesDriver
from regions.models import DeploymentTarget
from regions.services.deployments import deployment_create, deployment_delete
from regions.workloads import target_workload
from routing import selectors as routing_selectors
from routing import services as routing
from tests.support.kube_api import KubeApiServer
from tests.support.kube_schemas import http_route_errors, validate_kubernetes
from tests.support.principals import principal
from tests.support.regions import L4_SPEC, converge, kubernetes_region, tiny_version

DOMAIN = "engines.eu.example.com"
MODES = {
    "cluster": {},
    "loadbalancer": {
        "mode": "loadbalancer",
        "service_annotations": {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"},
    },
    "ingress": {
        "mode": "ingress",
        "base_domain": DOMAIN,
        "tls_secret": "engines-eu-tls",
        "ingress_class": "nginx",
    },
    "gateway-api": {"mode": "gateway-api", "base_domain": DOMAIN, "gateway": "gateways/engines-eu"},
}
SPEC = replace(L4_SPEC, name="cp-7-chat-r2", api_key_id="3f2a9c")


def config(mode: str) -> KubernetesConfig:
    return KubernetesConfig.parse(
        {"namespace": "llm", "kubeconfig_file": "/dev/null", "exposure": MODES[mode]}
    )


@pytest.mark.parametrize("mode", MODES)
def test_every_manifest_of_each_mode_validates_against_its_schema(mode):
    manifests = list(yaml.safe_load_all(KubernetesDriver(config(mode), client.ApiClient()).render(SPEC)))
    for manifest in manifests:
        if manifest["kind"] == "HTTPRoute":
            assert http_route_errors(manifest) == []
        else:
            validate_kubernetes(manifest)
    kinds = {m["kind"]: m for m in manifests}
    service = kinds["Service"]
    assert service["spec"]["type"] == ("LoadBalancer" if mode == "loadbalancer" else "ClusterIP")
    if mode == "loadbalancer":
        assert service["metadata"]["annotations"] == MODES[mode]["service_annotations"]
    if mode == "ingress":
        ingress = kinds["Ingress"]["spec"]
        assert ingress["rules"][0]["host"] == f"cp-7-chat-r2.{DOMAIN}"
        assert ingress["tls"] == [{"hosts": [f"cp-7-chat-r2.{DOMAIN}"], "secretName": "engines-eu-tls"}]
        assert ingress["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == "cp-7-chat-r2-engine"
    if mode == "gateway-api":
        route = kinds["HTTPRoute"]["spec"]
        assert route["parentRefs"] == [{"name": "engines-eu", "namespace": "gateways"}]
        assert route["hostnames"] == [f"cp-7-chat-r2.{DOMAIN}"]
    assert not {"Ingress", "HTTPRoute"} & set(kinds) or mode in ("ingress", "gateway-api")


@pytest.mark.parametrize(
    ("exposure", "message"),
    [
        ({"mode": "nodeport"}, "exposure.mode must be one of"),
        ("loadbalancer", "exposure must be an object"),
        ({"mode": "ingress"}, "needs base_domain"),
        ({"mode": "ingress", "base_domain": "not a domain"}, "needs base_domain"),
        ({"mode": "ingress", "base_domain": "x.example.com\x00"}, "needs base_domain"),
        ({"mode": "gateway-api", "base_domain": DOMAIN}, "needs gateway"),
        ({"mode": "gateway-api", "base_domain": DOMAIN, "gateway": "just-a-name"}, "needs gateway"),
        ({"mode": "ingress", "base_domain": DOMAIN, "tls_secret": "Bad_Name"}, "tls_secret"),
        ({"mode": "loadbalancer", "service_annotations": ["a"]}, "service_annotations"),
        ({"mode": "loadbalancer", "service_annotations": {"a": 1}}, "service_annotations"),
        ({"mode": "cluster", "base_domain": 7}, "are strings"),
        ({"mode": "cluster", "port": 443}, "Unknown exposure setting"),
    ],
)
def test_a_bad_exposure_is_refused_with_what_is_wrong(exposure, message):
    with pytest.raises(ValidationFailed, match=message):
        KubernetesConfig.parse({"namespace": "llm", "kubeconfig_file": "/k", "exposure": exposure})


ROUTE_ACCEPTED = {
    "parents": [
        {
            "parentRef": {"name": "engines-eu", "namespace": "gateways"},
            "controllerName": "example.com/gateway-controller",
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""}],
        }
    ]
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("mode", "reported", "endpoint"),
    [
        (
            "loadbalancer",
            ("Service", "{}-engine", {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}),
            "http://203.0.113.7:8000",
        ),
        (
            "ingress",
            ("Ingress", "{}", {"loadBalancer": {"ingress": [{"hostname": "lb-1.elb.example.com"}]}}),
            "https://{}." + DOMAIN,
        ),
        ("gateway-api", ("HTTPRoute", "{}", ROUTE_ACCEPTED), "https://{}." + DOMAIN),
    ],
)
def test_a_workload_is_routable_only_at_the_address_its_cluster_reports(
    world, tmp_path, tiny_model_dir, mode, reported, endpoint
):
    with KubeApiServer() as kube:
        kubernetes_region(principal(world.operator), kube.kubeconfig(), tmp_path, exposure=MODES[mode])
        version = tiny_version(principal(world.operator), tiny_model_dir)
        chat = deployment_create(
            actor=principal(world.alice),
            owner=world.tenant_a,
            name="chat",
            model=version.model,
            version="1.0.0",
        )
        converge(chat)
        target = DeploymentTarget.objects.get(deployment=chat)
        name = target_workload(target)
        # The engines answer, but nobody outside the cluster can reach them yet: not routable.
        assert (target.status, target.ready_replicas, target.endpoints) == ("provisioning", 1, [])
        assert target.last_error.startswith("waiting for the")
        assert _published(chat) == []
        kind, object_name, status = reported
        kube.state.reported[(kind, object_name.format(name))] = status  # the cloud's controller answers
        converge(chat)
        target.refresh_from_db()
        assert (target.status, target.endpoints, target.last_error) == ("ready", [endpoint.format(name)], "")
        assert _published(chat) == [endpoint.format(name)]
        deployment_delete(actor=principal(world.alice), deployment=chat)
        converge(chat)
        assert not kube.state.objects  # the Ingress or HTTPRoute went with the rest


def _published(deployment) -> list[str]:  # type: ignore[no-untyped-def]
    routing.publish()
    table = routing_selectors.current()
    assert table is not None
    route = table.body["tenants"]["acme"]["models"].get("chat", {"endpoints": []})
    return [e["url"] for e in route["endpoints"]]
