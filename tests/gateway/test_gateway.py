"""End to end: engines in three local regions, the routing loop's functions, the live control plane over
HTTP and the gateway as its own process (uvicorn), called like an OpenAI client would."""

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import requests

from billing.models import UsageRecord
from gateway.fleet_limits import keys
from routing import health, services
from routing.models import RouteTable, RoutingEvent
from tests.support.gateway import Gateway, chat, kill_engines, stream_chat
from tests.support.principals import principal
from tests.support.processes import free_port, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_an_eu_tenant_is_served_at_home_streams_and_is_metered_exactly_once(world, fleet):
    gateway, alice = fleet["gateway"], fleet["tokens"]["alice"]
    replies = [chat(gateway, alice) for _ in range(5)]
    assert all(r.status_code == 200 for r in replies), replies[0].text
    assert {r.headers["x-served-region"] for r in replies} == {"eu-west-1"}  # home first
    assert replies[0].headers["x-model-version"] == "tiny-llama@1.0.0"
    request_id = replies[0].headers["x-request-id"]

    headers, events = stream_chat(gateway, alice)
    assert headers["content-type"].startswith("text/event-stream")
    assert len(events) > 3 and events[-1] == b"data: [DONE]"

    wait_for(lambda: UsageRecord.objects.count() == 6, timeout=20)
    time.sleep(2.5)  # two more shipping rounds: nothing is sent twice
    assert UsageRecord.objects.count() == 6
    record = UsageRecord.objects.get(request_id=request_id)
    assert record.tenant == world.tenant_a and record.region == "eu-west-1" and record.prompt_tokens > 0
    assert record.deployment == fleet["deployment"] and len(record.artifact_sha256) == 64
    streamed_record = UsageRecord.objects.get(stream=True)
    assert streamed_record.completion_tokens > 0  # from the stream's final usage event

    trace = requests.get(
        f"{fleet['live'].url}/api/v1/usage/{request_id}/",
        headers={"Authorization": f"Bearer {alice}"},
        timeout=5,
    )
    assert trace.status_code == 200 and trace.json()["region"] == "eu-west-1"
    assert trace.json()["deployment"] == "chat" and trace.json()["version"] == "tiny-llama@1.0.0"
    other = requests.get(
        f"{fleet['live'].url}/api/v1/usage/{request_id}/",
        headers={"Authorization": f"Bearer {fleet['tokens']['bob']}"},
        timeout=5,
    )
    assert other.status_code == 404  # another tenant's request id does not exist for bob


def test_completions_embeddings_and_models(world, fleet):
    gateway, auth = fleet["gateway"], {"Authorization": f"Bearer {fleet['tokens']['alice']}"}
    completion = requests.post(
        f"{gateway.url}/v1/completions",
        json={"model": "chat", "prompt": "Once", "max_tokens": 4},
        headers=auth,
    )
    assert completion.status_code == 200 and completion.json()["usage"]["completion_tokens"] > 0
    embedding = requests.post(
        f"{gateway.url}/v1/embeddings", json={"model": "chat", "input": "hi"}, headers=auth
    )
    assert embedding.status_code == 200 and embedding.json()["data"][0]["embedding"]
    listed = requests.get(f"{gateway.url}/v1/models", headers=auth).json()
    assert [m["id"] for m in listed["data"]] == ["chat"]
    assert requests.get(f"{gateway.url}/v1/nothing", headers=auth).status_code == 404


def test_other_tenants_and_bad_tokens_are_refused(world, fleet):
    gateway = fleet["gateway"]
    assert (
        chat(gateway, fleet["tokens"]["bob"]).status_code == 404
    )  # globex has no `chat`: acme's is invisible
    assert chat(gateway, "cpt_nope_nope").status_code == 401
    models = requests.get(
        f"{gateway.url}/v1/models", headers={"Authorization": f"Bearer {fleet['tokens']['bob']}"}, timeout=5
    ).json()
    assert models["data"] == []
    bad = requests.post(
        f"{gateway.url}/v1/chat/completions",
        data="{not json",
        headers={"Authorization": f"Bearer {fleet['tokens']['alice']}"},
        timeout=5,
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"


def test_killing_the_home_region_moves_traffic_without_a_failed_request_then_fails_closed(world, fleet):
    gateway, alice, deployment = fleet["gateway"], fleet["tokens"]["alice"], fleet["deployment"]
    kill_engines(fleet["regions"]["eu-west-1"], deployment)
    killed = time.monotonic()
    first = chat(gateway, alice)
    first_elsewhere = time.monotonic() - killed
    assert first.status_code == 200 and first.headers["x-served-region"] == "eu-central-1"
    assert first_elsewhere < 2.0  # the gateway retried on the next compliant region at once
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: chat(gateway, alice), range(20)))
    assert [r.status_code for r in replies] == [200] * 20  # retried before the first byte, never failed
    assert {r.headers["x-served-region"] for r in replies} == {"eu-central-1"}
    for _ in range(3):
        health.cycle()  # the prober ejects eu-west-1 (2 failures) and the table fails over
    assert RoutingEvent.objects.filter(
        kind="failover", from_region="eu-west-1", to_region="eu-central-1"
    ).exists()

    kill_engines(fleet["regions"]["eu-central-1"], deployment)
    for _ in range(3):
        health.cycle()
    generation = RouteTable.objects.order_by("-generation").first().generation
    wait_for(lambda: gateway.generation() == generation, timeout=10)  # long-poll brings it at once
    refused = chat(gateway, alice)
    assert refused.status_code == 503
    error = refused.json()["error"]
    assert error["code"] == "residency_unavailable" and "data residency (CH, EU)" in error["message"]
    assert RoutingEvent.objects.filter(kind="unavailable").exists()


def test_the_gateway_keeps_serving_from_its_cached_table_when_the_control_plane_is_down(fleet, tmp_path):
    alice = fleet["tokens"]["alice"]
    cache = tmp_path / "routes.json"
    assert json.loads(cache.read_text())["generation"] >= 1
    assert cache.stat().st_mode & 0o777 == 0o600  # engine keys and tenants' secrets: the gateway's alone
    fleet["gateway"].stop()
    dead_control_plane = f"http://127.0.0.1:{free_port()}"
    again = Gateway(dead_control_plane, "irrelevant", cache, tmp_path / "gateway2.log")
    try:
        reply = chat(again, alice)
        assert reply.status_code == 200 and reply.headers["x-served-region"] == "eu-west-1"
    finally:
        again.stop()
        fleet["gateway"].proc = subprocess.Popen(["true"])  # the fixture's stop() has one to wait for


def _republish(fleet, now=None) -> None:  # type: ignore[no-untyped-def]
    generation = services.publish(now).generation
    wait_for(lambda: fleet["gateway"].generation() == generation, timeout=10)


def test_rate_limits_per_tenant_on_requests_and_tokens(world, fleet):
    world.tenant_a.requests_per_minute = 3
    world.tenant_a.save()
    _republish(fleet)
    codes = [chat(fleet["gateway"], fleet["tokens"]["alice"]).status_code for _ in range(5)]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]

    world.tenant_a.requests_per_minute, world.tenant_a.tokens_per_minute = None, 10
    world.tenant_a.save()
    _republish(fleet)
    first = chat(fleet["gateway"], fleet["tokens"]["alice"], max_tokens=16)  # spends more than 10 tokens
    assert first.status_code == 200 and first.json()["usage"]["total_tokens"] > 10
    refused = chat(fleet["gateway"], fleet["tokens"]["alice"])
    assert refused.status_code == 429 and "tokens per minute (10)" in refused.json()["error"]["message"]


def test_two_gateway_processes_sharing_redis_give_a_tenant_its_limit_once(world, fleet, redis_url, tmp_path):
    redis.Redis.from_url(redis_url).delete(*keys("acme"))  # no bucket left over from an earlier test
    world.tenant_a.requests_per_minute = 4
    world.tenant_a.save()
    generation = services.publish().generation
    shared = {"GATEWAY_REDIS_URL": redis_url}
    live, token = fleet["live"].url, fleet["gateway_token"]
    pair = [
        Gateway(live, token, tmp_path / f"routes-{n}.json", tmp_path / f"gw-{n}.log", **shared)
        for n in (1, 2)
    ]
    try:
        wait_for(lambda: all(g.generation() == generation for g in pair), timeout=10)
        codes = [chat(pair[n % 2], fleet["tokens"]["alice"]).status_code for n in range(8)]
        assert sorted(codes) == [200] * 4 + [429] * 4, codes  # 4 between them, not 4 each
        assert all(g.health()["limits"]["shared_decisions"] == 4 for g in pair)
    finally:
        for gateway in pair:
            gateway.stop()


def test_a_spent_budget_with_a_hard_limit_stops_new_requests_at_the_gateway(world, fleet):
    from django.utils import timezone

    from billing.models import BudgetAlert

    world.tenant_a.monthly_budget, world.tenant_a.budget_hard_limit = 100, True
    world.tenant_a.save()
    now = timezone.now()  # one clock reading: the alert's month is the month the table is built for
    BudgetAlert.objects.create(
        tenant=world.tenant_a, period=now.strftime("%Y-%m"), threshold=100, spent=101, budget=100
    )
    _republish(fleet, now)
    refused = chat(fleet["gateway"], fleet["tokens"]["alice"])
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"
    assert "monthly budget" in refused.json()["error"]["message"]


def test_a_revoked_token_is_refused_once_the_table_moves_on(world, fleet):
    from core.models import ApiToken
    from core.services.tokens import token_digest, token_revoke

    alice = fleet["tokens"]["alice"]
    assert chat(fleet["gateway"], alice).status_code == 200
    token_revoke(actor=principal(world.alice), token=ApiToken.objects.get(digest=token_digest(alice)))
    _republish(fleet)  # the router loop does this within a second
    assert chat(fleet["gateway"], alice).status_code == 401


def test_route_table_api_is_tenant_scoped_conditional_and_exported(world, fleet, api):
    services.publish()
    mine = api(world.alice).get("/api/v1/routing/table/")
    assert mine.status_code == 200 and set(mine.json()["tenants"]) == {world.tenant_a.slug}
    assert mine.json()["tenants"][world.tenant_a.slug]["models"]["chat"]["endpoints"]
    theirs = api(world.bob).get("/api/v1/routing/table/")
    assert set(theirs.json()["tenants"]) == {world.tenant_b.slug}  # nothing of acme's
    again = api(world.alice).get("/api/v1/routing/table/", HTTP_IF_NONE_MATCH=mine["ETag"])
    assert again.status_code == 304
    assert (
        api(world.alice).get("/api/v1/routing/gateway-config/").status_code == 403
    )  # token digests: gateways only
    assert api(world.operator).get("/api/v1/routing/gateway-config/").status_code == 403
    # Engines' keys and tenants' secrets: a gateway's service account only, never a person, even an admin.
    assert api(world.admin).get("/api/v1/routing/gateway-config/").status_code == 403
    assert (
        "credentials"
        in api(secret=fleet["gateway_token"]).get("/api/v1/routing/gateway-config/").json()["table"]
    )
    nginx = api(world.alice).get("/api/v1/routing/export/nginx/")
    assert nginx.status_code == 200 and f"upstream {world.tenant_a.slug}__chat" in nginx.content.decode()
    assert "backup" in nginx.content.decode()  # eu-central-1 takes over only when eu-west-1 is down
    assert world.tenant_a.slug not in api(world.bob).get("/api/v1/routing/export/nginx/").content.decode()
    impact = api(world.operator).get("/api/v1/routing/what-if/?region=eu-west-1").json()["impact"]
    assert impact == [
        {
            "tenant": world.tenant_a.slug,
            "model": "chat",
            "effect": "loses capacity",
            "endpoints_before": 2,
            "endpoints_after": 1,
            "served_from_after": ["eu-central-1"],
            "reason": "",
        }
    ]
    assert api(world.bob).get("/api/v1/routing/what-if/?region=eu-west-1").json()["impact"] == []
    assert api(world.operator).get("/api/v1/routing/what-if/?region=nowhere").status_code == 400
    assert api(world.bob).get("/api/v1/routing/health/").json() == []
    assert len(api(world.operator).get("/api/v1/routing/health/").json()) == 2
