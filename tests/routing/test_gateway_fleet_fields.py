"""What routing publishes for the gateways' fleet behaviour: a token's priority with its credential, a
tenant's requests-in-flight limit with its other limits, and which endpoints are saturated (from vLLM's
own gauges). The gateway's use of them is tests/gateway."""

from datetime import UTC, datetime

import pytest

from billing.models import BudgetAlert
from billing.reports import thresholds_of
from core.services.tokens import token_create, token_digest
from routing import selectors
from routing.routes import Endpoint, TenantPolicy, route, saturated
from tests.support.principals import principal
from tests.support.routes import placement

pytestmark = pytest.mark.django_db


def test_a_tokens_priority_travels_with_its_credential(world):
    alice = principal(world.alice)
    _, batch = token_create(
        actor=alice, name="nightly", scopes=["models:invoke"], tenant=world.tenant_a, priority="batch"
    )
    _, interactive = token_create(actor=alice, name="app", scopes=["models:invoke"], tenant=world.tenant_a)
    published = selectors.credentials()
    assert published[token_digest(batch)]["priority"] == "batch"
    assert published[token_digest(interactive)]["priority"] == "interactive"


def test_a_tenants_limit_on_requests_in_flight_is_published_with_the_others(world):
    world.tenant_a.concurrent_requests, world.tenant_a.requests_per_minute = 8, 600
    world.tenant_a.save()
    limits = {p.slug: p.limits for p in selectors.policies()}
    assert limits[world.tenant_a.slug] == {"requests_per_minute": 600, "concurrent_requests": 8}
    assert limits[world.tenant_b.slug] == {}


@pytest.mark.parametrize(
    "body",
    [
        {"priority": "urgent"},
        {"priority": ""},
        {"priority": 1},
        {"priority": ["batch"]},
        {"priority": "batch\x00"},
    ],
)
def test_a_bad_priority_is_a_400_and_mints_nothing(world, api, body):
    reply = api(world.alice).post(
        "/api/v1/tokens/",
        {"name": "x", "scopes": ["models:invoke"], "tenant": world.tenant_a.slug, **body},
        format="json",
    )
    assert reply.status_code == 400 and set(reply.json()) == {"error"}
    assert not world.alice.tokens.filter(name="x").exists()


def test_the_api_mints_a_batch_token_and_shows_its_priority(world, api):
    reply = api(world.alice).post(
        "/api/v1/tokens/",
        {"name": "nightly", "scopes": ["models:invoke"], "tenant": world.tenant_a.slug, "priority": "batch"},
        format="json",
    )
    assert reply.status_code == 201 and reply.json()["priority"] == "batch"
    assert api(world.alice).get(f"/api/v1/tokens/{reply.json()['id']}/").json()["priority"] == "batch"


def test_an_engine_with_a_queue_or_a_nearly_full_kv_cache_is_saturated():
    assert not saturated(Endpoint("http://e", running=40, waiting=0, kv_cache=0.9))
    assert saturated(Endpoint("http://e", waiting=1))
    assert saturated(Endpoint("http://e", kv_cache=0.95))
    busy = placement(tenant="t", endpoints=(Endpoint("http://e", waiting=3),))
    (published,) = route(TenantPolicy("t", frozenset({"EU"})), [busy])["endpoints"]
    assert published["saturated"] is True


def test_past_its_degrade_threshold_a_tenant_is_published_degraded_until_the_month_ends(world):
    now = datetime(2026, 12, 10, tzinfo=UTC)
    world.tenant_a.budget_thresholds, world.tenant_a.budget_degrade_at = [50, 100], 80
    world.tenant_a.save()
    assert thresholds_of(world.tenant_a) == [50, 80, 100]  # the degrade threshold fires like the others
    BudgetAlert.objects.create(tenant=world.tenant_a, period="2026-12", threshold=50, spent=50, budget=100)
    assert all(not p.degraded for p in selectors.policies(now))
    BudgetAlert.objects.create(tenant=world.tenant_a, period="2026-12", threshold=80, spent=80, budget=100)
    degraded = {p.slug: p.degraded for p in selectors.policies(now)}
    assert "80 %" in degraded[world.tenant_a.slug] and not degraded[world.tenant_b.slug]
    next_month = datetime(2027, 1, 2, tzinfo=UTC)
    assert all(not p.degraded for p in selectors.policies(next_month))


@pytest.mark.parametrize(
    "change",
    [
        {"concurrent_requests": 0},
        {"concurrent_requests": 10**12},
        {"concurrent_requests": "many"},
        {"budget_degrade_at": 0},
        {"budget_degrade_at": 1001},
        {"budget_degrade_at": 80.5},
        {"budget_degrade_at": "80\x00"},
    ],
)
def test_bad_limits_on_a_tenant_are_a_400_and_change_nothing(world, api, change):
    reply = api(world.admin).patch(f"/api/v1/tenants/{world.tenant_a.slug}/", change, format="json")
    assert reply.status_code == 400 and set(reply.json()) == {"error"}
    world.tenant_a.refresh_from_db()
    assert world.tenant_a.concurrent_requests is None and world.tenant_a.budget_degrade_at is None


def test_a_platform_admin_sets_a_tenants_limits_and_a_tenant_admin_cannot(world, api):
    path = f"/api/v1/tenants/{world.tenant_a.slug}/"
    change = {"concurrent_requests": 16, "budget_degrade_at": 80}
    assert api(world.alice).patch(path, change, format="json").status_code == 403
    reply = api(world.admin).patch(path, change, format="json")
    assert reply.status_code == 200 and reply.json()["concurrent_requests"] == 16
    assert reply.json()["budget_degrade_at"] == 80
