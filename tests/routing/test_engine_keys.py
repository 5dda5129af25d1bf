"""Engines answer only the gateways: every deployment's engines start with its own API key, the route
table carries the keys to gateways (gateway:sync) and to nobody else, and none is ever stored or shown."""

import json
from dataclasses import asdict

import pytest
import requests

from regions.drivers.factory import driver_for
from regions.engine_keys import engine_api_key, key_fingerprint
from regions.services.deployments import deployment_create
from regions.workloads import workload_spec
from routing import services
from routing.models import RouteTable
from tests.support.gateway import gateway_secret
from tests.support.principals import principal
from tests.support.regions import ready_targets, tiny_version

pytestmark = pytest.mark.django_db(transaction=True)
CONFIG = "/api/v1/routing/gateway-config/"


@pytest.fixture
def served(world, make_region, tiny_model_dir):  # type: ignore[no-untyped-def]
    make_region("eu-west-1", "EU")
    version = tiny_version(principal(world.operator), tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    (target,) = ready_targets(deployment, 1)
    return deployment, target


def test_each_deployment_has_its_own_key_from_the_root(settings):
    first = engine_api_key(1)
    assert first == engine_api_key(1) and first != engine_api_key(2) and len(first) == 64
    settings.ENGINE_KEY_SECRET = "a new root"
    assert engine_api_key(1) != first and key_fingerprint(1) != key_fingerprint(2)


def test_the_engine_refuses_callers_without_the_key_and_only_gateways_get_it(world, served, api):
    deployment, target = served
    key, endpoint = engine_api_key(deployment.pk), target.endpoints[0]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert requests.post(f"{endpoint}/v1/chat/completions", json=body, timeout=5).status_code == 401
    assert requests.get(f"{endpoint}/v1/models", timeout=5).status_code == 401
    assert requests.get(f"{endpoint}/health", timeout=5).status_code == 200  # probes need none
    auth = {"Authorization": f"Bearer {key}"}
    assert requests.post(f"{endpoint}/v1/chat/completions", json=body, headers=auth, timeout=5).ok

    spec = workload_spec(target)  # the workload names the key, never holds it
    assert spec.api_key_id == key_fingerprint(deployment.pk) and key not in json.dumps(asdict(spec))
    assert key not in driver_for(target.region).render(spec)

    services.publish()
    assert all(key not in json.dumps(t.body) for t in RouteTable.objects.all())  # never stored
    gateway = api(secret=gateway_secret(world)).get(CONFIG).json()
    (route,) = gateway["table"]["tenants"]["acme"]["models"].values()
    assert [e["api_key"] for e in route["endpoints"]] == [key]
    for path in (
        "/api/v1/routing/table/",
        "/api/v1/routing/export/envoy/",
        "/api/v1/routing/export/nginx/",
        "/api/v1/routing/export/gateway-api/?region=eu-west-1",
    ):
        for user in (world.alice, world.operator):
            shown = api(user).get(path)
            assert shown.status_code == 200 and key not in shown.content.decode(), path
    assert api(world.alice).get(CONFIG).status_code == 403


def test_a_new_root_key_reaches_gateways_at_once(world, served, api, settings):
    gateway = api(secret=gateway_secret(world))
    first = gateway.get(CONFIG)
    etag = first["ETag"]
    assert gateway.get(CONFIG, HTTP_IF_NONE_MATCH=etag).status_code == 304  # nothing new
    settings.ENGINE_KEY_SECRET = "rotated"
    rotated = gateway.get(CONFIG, {"wait": 5}, HTTP_IF_NONE_MATCH=etag)  # answered now, not in 5 s
    assert rotated.status_code == 200 and rotated["ETag"] != etag
    (route,) = rotated.json()["table"]["tenants"]["acme"]["models"].values()
    assert route["endpoints"][0]["api_key"] == engine_api_key(served[0].pk)
    assert rotated.json()["generation"] == first.json()["generation"]  # the same table, new keys
