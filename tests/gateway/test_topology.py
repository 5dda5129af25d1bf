"""Gateways per region behind a global entry, as processes in front of the live control plane and real
local engines in two EU regions: the entry forwards by residency to the regional gateway of the route's
first region, each regional gateway serves only its own region's engines and meters once, a dead regional
gateway moves traffic to the next compliant region, and a route served in no region with a gateway at the
entry fails closed (a US gateway is never asked)."""

import json
import time

import pytest
import requests

from billing.models import UsageRecord
from tests.support.gateway import Gateway, chat, stream_chat
from tests.support.gateway_harness import reply, serve
from tests.support.processes import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def regional(fleet, tmp_path):  # type: ignore[no-untyped-def]
    """A gateway per EU region, a stand-in US gateway that records what reaches it, and the entry."""
    started = []

    def gateway(name: str, *args: str, **settings: str) -> Gateway:
        started.append(
            Gateway(
                fleet["live"].url,
                fleet["gateway_token"],
                tmp_path / f"{name}.json",
                tmp_path / f"{name}.log",
                *args,
                **settings,
            )
        )
        return started[-1]

    west = gateway("west", GATEWAY_REGIONS="eu-west-1")
    central = gateway("central", GATEWAY_REGIONS="eu-central-1")
    us_seen: list[bytes] = []
    us_url, us_server = serve(lambda handler, body: (us_seen.append(body), reply(handler, 200, {}))[1])
    regions = f"eu-west-1={west.url},eu-central-1={central.url},us-east-1={us_url}"
    entry = gateway("entry", "--entry", GATEWAY_ENTRY_REGIONS=regions)
    yield {"west": west, "central": central, "entry": entry, "us_seen": us_seen}
    for process in started:
        if process.proc.poll() is None:
            process.stop()
    us_server.shutdown()


def test_the_entry_forwards_to_the_home_regions_gateway_which_meters_once(world, fleet, regional):
    entry, alice = regional["entry"], fleet["tokens"]["alice"]
    replies = [chat(entry, alice) for _ in range(3)]
    assert [r.status_code for r in replies] == [200] * 3, replies[0].text
    assert {r.headers["x-served-region"] for r in replies} == {"eu-west-1"}
    headers, events = stream_chat(entry, alice)
    assert headers["content-type"].startswith("text/event-stream")
    assert len(events) > 3 and events[-1] == b"data: [DONE]"
    wait_for(lambda: UsageRecord.objects.count() == 4, timeout=20)
    time.sleep(2.5)  # more shipping rounds: the entry meters nothing, the regional gateway once
    assert UsageRecord.objects.count() == 4
    ids = {r.headers["x-request-id"] for r in replies}  # the regional gateway's ids reach the client
    assert ids <= set(UsageRecord.objects.values_list("request_id", flat=True))
    assert json.loads(requests.get(f"{entry.url}/healthz", timeout=5).text)["forwarded"] == {"eu-west-1": 4}
    assert regional["us_seen"] == []


def test_a_regional_gateway_serves_only_its_region(fleet, regional):
    central, alice = regional["central"], fleet["tokens"]["alice"]
    replies = [chat(central, alice) for _ in range(3)]
    assert [r.status_code for r in replies] == [200] * 3
    assert {r.headers["x-served-region"] for r in replies} == {"eu-central-1"}  # not acme's home


def test_a_dead_regional_gateway_moves_traffic_to_the_next_compliant_region(fleet, regional):
    entry, alice = regional["entry"], fleet["tokens"]["alice"]
    regional["west"].proc.kill()
    regional["west"].proc.wait(timeout=10)
    replies = [chat(entry, alice) for _ in range(5)]
    assert [r.status_code for r in replies] == [200] * 5
    assert {r.headers["x-served-region"] for r in replies} == {"eu-central-1"}
    assert regional["us_seen"] == []


def test_no_gateway_in_a_compliant_region_fails_closed_and_other_tenants_see_nothing(
    fleet, regional, tmp_path
):
    alice, bob = fleet["tokens"]["alice"], fleet["tokens"]["bob"]
    us_only = Gateway(
        fleet["live"].url,
        fleet["gateway_token"],
        tmp_path / "us-only.json",
        tmp_path / "us-only.log",
        "--entry",
        GATEWAY_ENTRY_REGIONS=f"us-east-1={regional['entry'].url.replace('127.0.0.1', 'localhost')}",
    )
    try:
        refused = chat(us_only, alice)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "model_unavailable"
        assert "residency" in refused.json()["error"]["message"]
        assert regional["us_seen"] == []
        assert chat(regional["entry"], bob).status_code == 404  # bob's tenant has no model 'chat'
        assert chat(regional["entry"], "cpt_nobody_secret").status_code == 401
    finally:
        us_only.stop()
