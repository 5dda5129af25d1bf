"""Usage ingestion: only gateways may send, a batch counts once however often it arrives, bad input is
refused whole, and a request id is traced only by its own tenant."""

import uuid

import pytest

from billing.models import UsageRecord
from tests.support.gateway import gateway_secret

pytestmark = pytest.mark.django_db


def record(tenant: str, **extra) -> dict:  # type: ignore[no-untyped-def]
    return {
        "request_id": uuid.uuid4().hex,
        "tenant": tenant,
        "model_name": "chat",
        "region": "eu-west-1",
        "version": "tiny-llama@1.0.0",
        "status": 200,
        "prompt_tokens": 9,
        "completion_tokens": 4,
        "latency_ms": 12.5,
        "started_at": "2026-11-29T10:00:00+00:00",
        **extra,
    }


@pytest.fixture
def gateway_token(world):  # type: ignore[no-untyped-def]
    return gateway_secret(world)


def test_a_batch_sent_twice_counts_once(world, api, gateway_token):
    batch = [record(world.tenant_a.slug), record(world.tenant_b.slug)]
    batch.append(dict(batch[0]))  # a duplicate inside the batch too
    first = api(secret=gateway_token).post("/api/v1/usage/", {"records": batch}, format="json")
    assert first.status_code == 200 and first.json() == {"accepted": 2, "duplicates": 1}
    again = api(secret=gateway_token).post("/api/v1/usage/", {"records": batch}, format="json")
    assert again.json() == {"accepted": 0, "duplicates": 3}
    assert UsageRecord.objects.count() == 2


def test_only_gateways_send_and_bad_batches_write_nothing(world, api, gateway_token):
    good = record(world.tenant_a.slug)
    assert api(world.alice).post("/api/v1/usage/", {"records": [good]}, format="json").status_code == 403
    assert api(world.operator).post("/api/v1/usage/", {"records": [good]}, format="json").status_code == 403
    for bad in (
        {"records": [good, record("no-such-tenant")]},
        {"records": [good, {**record(world.tenant_a.slug), "prompt_tokens": "many"}]},
        {"records": [good, {**record(world.tenant_a.slug), "surprise": 1}]},
        {"records": "not a list"},
    ):
        reply = api(secret=gateway_token).post("/api/v1/usage/", bad, format="json")
        assert reply.status_code in (400, 422) and "error" in reply.json()
    assert UsageRecord.objects.count() == 0  # all or nothing


def test_a_request_is_traced_only_by_its_tenant(world, api, gateway_token):
    mine = record(world.tenant_a.slug)
    api(secret=gateway_token).post("/api/v1/usage/", {"records": [mine]}, format="json")
    traced = api(world.alice).get(f"/api/v1/usage/{mine['request_id']}/")
    assert traced.status_code == 200 and traced.json()["region"] == "eu-west-1"
    assert api(world.bob).get(f"/api/v1/usage/{mine['request_id']}/").status_code == 404
    assert api(world.operator).get(f"/api/v1/usage/{mine['request_id']}/").status_code == 200


def test_the_clients_request_id_is_kept_apart_and_found_only_within_its_tenant(world, api, gateway_token):
    # Both tenants sent the same X-Request-ID: two records, each tenant sees only its own.
    mine = record(world.tenant_a.slug, client_request_id="order-42")
    theirs = record(world.tenant_b.slug, client_request_id="order-42")
    reply = api(secret=gateway_token).post("/api/v1/usage/", {"records": [mine, theirs]}, format="json")
    assert reply.json() == {"accepted": 2, "duplicates": 0}
    found = api(world.alice).get("/api/v1/usage/?client_request_id=order-42")
    assert found.status_code == 200
    assert [r["request_id"] for r in found.json()] == [mine["request_id"]]
    assert found.json()[0]["client_request_id"] == "order-42" and found.json()[0]["tenant"] == "acme"
    assert [
        r["request_id"] for r in api(world.bob).get("/api/v1/usage/?client_request_id=order-42").json()
    ] == [theirs["request_id"]]
    assert len(api(world.operator).get("/api/v1/usage/?client_request_id=order-42").json()) == 2
    assert api(world.alice).get("/api/v1/usage/?client_request_id=other").json() == []
    # The trace is by the gateway's id; the client's id is not a key.
    assert api(world.alice).get("/api/v1/usage/order-42/").status_code == 404
    assert (
        api(world.alice).get(f"/api/v1/usage/{mine['request_id']}/").json()["client_request_id"] == "order-42"
    )
    assert api(world.alice).get(f"/api/v1/usage/{theirs['request_id']}/").status_code == 404


def test_the_control_planes_own_request_id_header_never_keys_usage(world, api, gateway_token):
    # RequestContextMiddleware accepts a caller's X-Request-ID for logs and audit; billing never uses it.
    client = api(secret=gateway_token)
    first, second = record(world.tenant_a.slug), record(world.tenant_a.slug)
    for batch in (first, second):
        reply = client.post("/api/v1/usage/", {"records": [batch]}, format="json", HTTP_X_REQUEST_ID="same")
        assert reply.json() == {"accepted": 1, "duplicates": 0} and reply["X-Request-ID"] == "same"
    assert UsageRecord.objects.count() == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"prompt_tokens": 2**31},
        {"prompt_tokens": 2**80},
        {"completion_tokens": -1},
        {"status": 70_000},
        {"status": -5},
        {"status": 99},
        {"attempts": 10**9},
        {"attempts": 0},
        {"latency_ms": "nan"},
        {"latency_ms": "inf"},
        {"latency_ms": -1},
        {"deployment": 2**70},
        {"started_at": "2026-13-45T99:00:00+00:00"},
        {"model_name": "chat\x00"},
        {"request_id": "abc\x00def"},
        {"client_request_id": "x\x00"},
        {"request_id": ""},
        {"version": {"a": 1}},
        {"stream": "sometimes"},
    ],
)
def test_out_of_range_values_are_a_400_and_the_batch_writes_nothing(world, api, gateway_token, bad):
    batch = [record(world.tenant_a.slug), {**record(world.tenant_a.slug), **bad}]
    reply = api(secret=gateway_token).post("/api/v1/usage/", {"records": batch}, format="json")
    assert reply.status_code == 400, reply.content
    error = reply.json()["error"]  # a NUL is refused by the API's JSON parser, before the usage checks
    assert error["code"] in ("invalid", "malformed_request") and "records[1]" in error["message"]
    assert UsageRecord.objects.count() == 0
