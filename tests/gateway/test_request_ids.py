"""The gateway mints its own request id for every request: a client's X-Request-ID is kept for correlation
only, so no header makes two requests one usage record or hides another tenant's request."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.models import UsageRecord
from billing.services import usage_ingest
from core.models import Tenant
from core.principal import Principal
from tests.support.gateway_harness import GatewayWorld


@pytest.fixture
def gw(tmp_path):  # type: ignore[no-untyped-def]
    world = GatewayWorld(tmp_path)
    yield world
    world.close()


def test_a_replayed_client_request_id_is_billed_every_time(gw):
    answers = [gw.chat(headers={"X-Request-ID": "same-id"}) for _ in range(5)]
    assert [a.status for a in answers] == [200] * 5
    minted = {a.headers["x-request-id"] for a in answers}
    assert len(minted) == 5 and "same-id" not in minted  # the gateway's own ids, one per request
    upstream = {seen["headers"]["X-Request-Id"] for seen in gw.engine.seen}
    assert upstream == minted  # the engine logs carry the gateway's id too
    assert gw.ship() == 5
    assert len(gw.control.records) == 5
    assert {r["client_request_id"] for r in gw.control.records} == {"same-id"}
    assert {r["request_id"] for r in gw.control.records} == minted


def test_an_error_reply_carries_the_gateways_id_not_the_clients(gw):
    refused = gw.chat(model="nope", headers={"X-Request-ID": "mine"})
    assert refused.status == 404 and refused.headers["x-request-id"] != "mine"
    assert refused.json()["error"]["request_id"] == refused.headers["x-request-id"]


client_ids = st.one_of(
    st.none(),
    st.sampled_from(["a", "same", "0" * 64]),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80),
)


@pytest.mark.django_db
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    requests=st.lists(
        st.tuples(st.sampled_from(["acme", "globex"]), client_ids, st.booleans()), min_size=1, max_size=12
    )
)
def test_n_requests_make_exactly_n_usage_records_whatever_the_headers(world, gw, requests):
    gw.control.records.clear()
    before = UsageRecord.objects.count()
    for tenant, client_id, stream in requests:
        headers = {} if client_id is None else {"X-Request-ID": client_id}
        assert gw.chat(tenant=tenant, model="shared", headers=headers, stream=stream).status == 200
    gw.ship()
    assert len(gw.control.records) == len(requests)
    # The control plane stores what the gateway sent, deduplicating by the gateway's id only.
    gateway = Principal.system("gateway")
    usage_ingest(actor=gateway, records=list(gw.control.records))
    assert UsageRecord.objects.count() - before == len(requests)
    assert usage_ingest(actor=gateway, records=list(gw.control.records))["accepted"] == 0  # re-sent: once
    for (tenant, client_id, stream), record in zip(requests, gw.control.records, strict=True):
        assert record["stream"] is stream and record["completion_tokens"] == 2
        assert (
            record["tenant"] == tenant
            and record.get("client_request_id", "") == (client_id or "").strip()[:128]
        )
    assert Tenant.objects.filter(slug__in=["acme", "globex"]).count() == 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_end_to_end_a_replayed_header_is_billed_and_traced_per_request(world, fleet, api):
    import requests as http

    from tests.support.gateway import chat
    from tests.support.processes import wait_for

    gateway, alice = fleet["gateway"], fleet["tokens"]["alice"]
    answers = [chat(gateway, alice)]
    answers += [
        http.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            headers={"Authorization": f"Bearer {alice}", "X-Request-ID": "retry-7"},
            timeout=30,
        )
        for _ in range(4)
    ]
    assert [a.status_code for a in answers] == [200] * 5
    wait_for(lambda: UsageRecord.objects.count() == 5, timeout=20)
    minted = {a.headers["x-request-id"] for a in answers}
    assert set(UsageRecord.objects.values_list("request_id", flat=True)) == minted
    found = api(world.alice).get("/api/v1/usage/?client_request_id=retry-7").json()
    assert len(found) == 4 and {r["request_id"] for r in found} < minted
    assert api(world.bob).get("/api/v1/usage/?client_request_id=retry-7").json() == []
