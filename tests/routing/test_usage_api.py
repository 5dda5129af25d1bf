"""Usage ingestion: only gateways may send, a batch counts once however often it arrives, bad input is
refused whole, and a request id is traced only by its own tenant."""

import uuid

import pytest

from billing.models import UsageRecord
from tests.routing.test_gateway import gateway_secret

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
