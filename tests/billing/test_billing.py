"""Metering from the reconciler, reports and their isolation, budgets firing once, idle GPUs.

No test here reads the wall clock: the history sits at fixed moments in the past, the code under test is
handed ``now``, and the API (which reads the clock at its edge) is called with the clock set by
time-machine. ``TEST_CLOCK=2026-12-01T00:30Z pytest …`` runs any test with the wall clock started there.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine

from billing import reports
from billing.models import BudgetAlert, CapacitySegment, GpuPrice, UsageRecord
from billing.services import evaluate_budgets
from core.models import AuditEvent
from regions.services.deployments import deployment_create, deployment_delete, deployment_scale
from routing import services as routing
from tests.support.billing import HISTORY, gpu_history, hourly_usage
from tests.support.principals import principal
from tests.support.regions import converge, tiny_version, until_ready

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # starts engines


@pytest.fixture
def chat(world, make_region, tiny_model_dir):  # type: ignore[no-untyped-def]
    make_region("eu-west-1", "EU")
    version = tiny_version(principal(world.operator), tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    converge(deployment, passes=2)
    return deployment


def test_the_reconciler_meters_gpus_held_through_scaling_and_deletion(world, chat):
    (first,) = CapacitySegment.objects.filter(deployment=chat)
    assert first.gpus == chat.gpu_count and first.ended_at is None and first.region.code == "eu-west-1"
    converge(chat)
    assert CapacitySegment.objects.filter(deployment=chat).count() == 1  # nothing changed, nothing written

    deployment_scale(actor=principal(world.alice), deployment=chat, replicas=2)
    converge(chat, passes=2)
    segments = list(CapacitySegment.objects.filter(deployment=chat).order_by("started_at"))
    assert [s.gpus for s in segments] == [chat.gpu_count, 2 * chat.gpu_count]
    assert segments[0].ended_at == segments[1].started_at  # no gap, no overlap

    deployment_delete(actor=principal(world.alice), deployment=chat)
    converge(chat, passes=2)
    assert not CapacitySegment.objects.filter(deployment=chat, ended_at__isnull=True).exists()


def test_the_monthly_report_attributes_cost_and_is_tenant_scoped(world, chat, api):
    gpu_history(world, chat)
    month = "2025-06"
    mine = api(world.alice).get(f"/api/v1/costs/?month={month}&group_by=tenant,region,version")
    assert mine.status_code == 200, mine.content
    (row,) = mine.json()["rows"]
    assert row["tenant"] == world.tenant_a.slug and row["region"] == "eu-west-1"
    assert Decimal(row["cost"]) == Decimal("25.00") and row["version"] == "tiny-llama@1.0.0"
    assert Decimal(row["gpu_hours"]) == Decimal("10.000") and row["requests"] == 10
    tokens = row["prompt_tokens"] + row["completion_tokens"]
    per_1m = (Decimal(row["cost"]) / tokens * 10**6).quantize(Decimal("0.0001"))
    assert Decimal(row["cost_per_1m_tokens"]) == per_1m
    assert Decimal(row["hosted_api_cost"]) == (Decimal("0.60") * tokens / 10**6).quantize(Decimal("0.01"))
    assert api(world.bob).get(f"/api/v1/costs/?month={month}").json()["rows"] == []  # none of acme's
    assert len(api(world.operator).get(f"/api/v1/costs/?month={month}").json()["rows"]) >= 1
    csv = api(world.alice).get(f"/api/v1/costs/?month={month}&group_by=tenant,day&export=csv")
    assert csv.status_code == 200 and csv["Content-Type"].startswith("text/csv")
    assert csv.content.decode().splitlines()[0].startswith("tenant,day,cost")
    assert api(world.alice).get("/api/v1/costs/?month=nope").status_code in (400, 422)
    assert api(world.alice).get("/api/v1/costs/?group_by=planet").status_code in (400, 422)


def test_a_history_across_a_month_boundary_is_split_between_the_two_months(world, chat, api):
    gpu_history(world, chat, hours=10, price="2.50", start=datetime(2025, 5, 31, 20, tzinfo=UTC))
    may, june = (
        api(world.alice).get(f"/api/v1/costs/?month={month}&group_by=tenant,day").json()["rows"]
        for month in ("2025-05", "2025-06")
    )
    assert [(r["day"], r["cost"], r["requests"]) for r in may] == [("2025-05-31", "10.00", 4)]
    assert [(r["day"], r["cost"], r["requests"]) for r in june] == [("2025-06-01", "15.00", 6)]


def test_a_report_bills_capacity_still_held_up_to_now_and_no_further(world, chat):
    gpu_history(world, chat, hours=10, price="2.50")
    CapacitySegment.objects.filter(deployment=chat).update(ended_at=None)  # still running
    now = HISTORY + timedelta(hours=3, minutes=30)
    report = reports.build(HISTORY.replace(day=1, hour=0), HISTORY.replace(month=7, day=1, hour=0), now=now)
    assert sum((line.cost for line in report.lines), Decimal(0)) == Decimal("8.75")  # 3.5 h × 2.50


def test_prices_need_billing_write_and_keep_history(world, chat, api):
    body = {
        "region": "eu-west-1",
        "gpu_type": "L4",
        "hourly_price": "0.80",
        "effective_from": "2026-01-01T00:00:00Z",
    }
    assert api(world.alice).post("/api/v1/prices/", body, format="json").status_code == 403
    assert api(world.admin).post("/api/v1/prices/", body, format="json").status_code == 201
    assert api(world.admin).post("/api/v1/prices/", body, format="json").status_code == 409  # same start
    later = {**body, "hourly_price": "0.95", "effective_from": "2026-06-01T00:00:00Z"}
    assert api(world.admin).post("/api/v1/prices/", later, format="json").status_code == 201
    bad = {**body, "pricing_model": "barter", "effective_from": "2026-02-01T00:00:00Z"}
    assert api(world.admin).post("/api/v1/prices/", bad, format="json").status_code in (400, 422)
    listed = api(world.alice).get("/api/v1/prices/").json()
    assert [p["hourly_price"] for p in listed] == ["0.8000", "0.9500"]


def test_budget_thresholds_fire_once_and_a_hard_limit_blocks_the_tenant(world, chat):
    gpu_history(world, chat, hours=4, price="10.00")  # 40.00 spent in June 2025
    now = HISTORY + timedelta(hours=5)
    month = reports.build(HISTORY.replace(day=1, hour=0), now, now=now)
    spent = sum((line.cost for line in month.lines if line.tenant == world.tenant_a.slug), Decimal(0))
    assert spent == Decimal("40.00")
    world.tenant_a.monthly_budget = spent  # exactly 100 %
    world.tenant_a.budget_hard_limit = True
    received: list[dict] = []
    world.tenant_a.budget_webhook = _webhook(received)
    world.tenant_a.save()
    fired = evaluate_budgets(now=now)
    assert sorted(a.threshold for a in fired) == [50, 80, 100]
    assert {a.period for a in fired} == {"2025-06"}
    assert sorted(r["threshold"] for r in received) == [50, 80, 100]  # the webhook heard each once
    assert evaluate_budgets(now=now + timedelta(hours=1)) == []  # once per threshold per month
    assert BudgetAlert.objects.filter(tenant=world.tenant_a).count() == 3
    assert AuditEvent.objects.filter(action="billing.budget_threshold", tenant=world.tenant_a).count() == 3
    view = routing.publish(now=now).body["tenants"][world.tenant_a.slug]
    assert "monthly budget" in view["blocked"]
    assert routing.publish(now=now).body["tenants"][world.tenant_b.slug]["blocked"] == ""
    next_month = routing.publish(now=datetime(2025, 7, 1, tzinfo=UTC)).body["tenants"]
    assert next_month[world.tenant_a.slug]["blocked"] == ""  # a new month, a new budget


def test_an_unused_deployment_is_flagged_idle_with_its_monthly_saving(world, chat, api):
    gpu_history(world, chat, hours=10, price="2.50")
    UsageRecord.objects.all().delete()
    with time_machine.travel(HISTORY + timedelta(hours=12), tick=False):  # the API reads the clock
        idle = api(world.alice).get("/api/v1/costs/idle/?hours=24").json()["deployments"]
        (found,) = idle
        assert found["deployment"] == f"{world.tenant_a.slug}/chat" and Decimal(found["utilization"]) == 0
        # It held its GPU 10 of the 24 hours: 25.00 / 10 h × 730 h, not 25.00 / 24 h × 730.
        assert Decimal(found["monthly_saving"]) == Decimal("1825.00")
        assert found["observed_hours"] == "10.00" and found["utilization_percent"] == "0.0"
        assert api(world.bob).get("/api/v1/costs/idle/").json()["deployments"] == []


def test_the_monthly_saving_of_a_young_deployment_uses_the_time_it_has_existed(world, chat):
    now = HISTORY + timedelta(hours=12)
    region = chat.targets.get().region
    CapacitySegment.objects.filter(deployment=chat).delete()
    CapacitySegment.objects.create(
        deployment=chat,
        version=chat.version,
        region=region,
        gpu_type="L4",
        gpus=1,
        started_at=now - timedelta(minutes=7),
    )
    GpuPrice.objects.create(
        region=region, gpu_type="L4", hourly_price=Decimal("0.92"), effective_from=now - timedelta(days=1)
    )
    day = reports.build(now - timedelta(hours=24), now, now=now)
    (found,) = reports.idle_deployments(day, Decimal("0.10"), None)
    assert found["monthly_saving"] == Decimal("671.60")  # 0.92 an hour × 730, not 0.11 / 24 h × 730 = 3.35
    assert found["observed_hours"] == Decimal("0.12")  # 7 minutes


def test_operators_set_budgets_and_limits_tenants_cannot_raise_their_own(world, api):
    slug = world.tenant_a.slug
    body = {
        "monthly_budget": "500.00",
        "budget_thresholds": [25, 90],
        "budget_hard_limit": True,
        "requests_per_minute": 600,
    }
    assert api(world.alice).patch(f"/api/v1/tenants/{slug}/", body, format="json").status_code == 403
    changed = api(world.admin).patch(f"/api/v1/tenants/{slug}/", body, format="json")
    assert changed.status_code == 200, changed.content
    world.tenant_a.refresh_from_db()
    assert world.tenant_a.budget_thresholds == [25, 90] and world.tenant_a.requests_per_minute == 600
    bad = api(world.admin).patch(f"/api/v1/tenants/{slug}/", {"budget_thresholds": [0]}, format="json")
    assert bad.status_code in (400, 422)


def test_a_budget_in_another_currency_than_costs_is_refused(world, api, settings):
    from controlplane.management.commands.seed_demo import TENANTS

    slug = world.tenant_a.slug
    body = {"monthly_budget": "500.00", "budget_currency": "EUR"}
    refused = api(world.admin).patch(f"/api/v1/tenants/{slug}/", body, format="json")
    assert refused.status_code == 400, refused.content
    assert "USD" in refused.json()["error"]["message"] and "budget_currency" in refused.content.decode()
    world.tenant_a.refresh_from_db()
    assert world.tenant_a.monthly_budget is None  # nothing changed
    new = {"slug": "eur-co", "name": "Eur Co", "residency": ["EU"], **body}
    assert api(world.admin).post("/api/v1/tenants/", new, format="json").status_code == 400
    ok = api(world.admin).patch(f"/api/v1/tenants/{slug}/", {**body, "budget_currency": "USD"}, format="json")
    assert ok.status_code == 200, ok.content
    settings.BILLING_CURRENCY = "EUR"  # a platform that keeps its costs in euros
    plain = {"slug": "eur-co", "name": "Eur Co", "residency": ["EU"], "monthly_budget": "10.00"}
    created = api(world.admin).post("/api/v1/tenants/", plain, format="json")
    assert created.status_code == 201 and created.json()["budget_currency"] == "EUR"  # the default follows
    settings.BILLING_CURRENCY = "USD"
    # The demo seed keeps budgets in the cost currency.
    assert {t["budget_currency"] for t in TENANTS if t.get("monthly_budget")} == {settings.BILLING_CURRENCY}


def test_the_costs_page_shows_a_tenant_admin_their_own_budget_only(world, chat, client):
    gpu_history(world, chat, hours=4, price="10.00")  # 40.00 spent by acme in June 2025
    world.tenant_a.monthly_budget, world.tenant_a.budget_thresholds = Decimal("100.00"), [25, 90]
    world.tenant_a.save()
    world.tenant_b.monthly_budget, world.tenant_b.budget_hard_limit = Decimal("777.00"), True
    world.tenant_b.save()
    with time_machine.travel(HISTORY + timedelta(hours=12), tick=False):  # the page reads the clock
        client.force_login(world.alice)
        mine = client.get("/costs/").content.decode()
        client.force_login(world.bob)
        theirs = client.get("/costs/").content.decode()
    budget = mine[mine.index('id="budgets"') :]
    assert world.tenant_a.slug in budget and "100.00 USD" in budget and "40.00 USD" in budget
    assert "40.0 %" in budget and "25 %, 90 %" in budget
    assert "777.00" not in mine and world.tenant_b.slug not in budget
    other = theirs[theirs.index('id="budgets"') :]
    assert "777.00 USD" in other and "0.00 USD" in other and "hard limit" in other
    assert world.tenant_a.slug not in other and "100.00 USD" not in other
    assert "Per 1M tokens (USD)" in mine and "%" in mine[mine.index('id="idle"') :]


def _webhook(received: list) -> str:  # type: ignore[type-arg]
    """A local HTTP endpoint that keeps what is POSTed to it."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}/budget"


def test_a_shared_deployment_is_split_by_tokens_with_idle_apart(
    world, make_region, tiny_model_dir, api, settings
):
    from regions.models import Deployment
    from registry.models import RegisteredModel

    settings.BILLING_TOKENS_PER_GPU_HOUR = {"default": 1000}  # weighted tokens one GPU serves in an hour
    settings.BILLING_PROMPT_TOKEN_WEIGHT = "0"
    make_region("eu-west-1", "EU")
    tiny_version(principal(world.operator), tiny_model_dir)
    catalog = RegisteredModel.objects.get(name="tiny-llama", owner=None)
    with pytest.raises(Exception, match="Only platform operators"):
        deployment_create(
            actor=principal(world.alice),
            owner=world.tenant_a,
            name="x",
            model=catalog,
            version="1.0.0",
            shared=True,
        )
    shared = deployment_create(
        actor=principal(world.operator),
        owner=world.tenant_a,
        name="assistant",
        model=catalog,
        version="1.0.0",
        regions=["eu-west-1"],
        shared=True,
    )
    until_ready(shared)
    table = routing.publish().body["tenants"]
    assert table[world.tenant_a.slug]["models"]["assistant"]["endpoints"]  # offered to every tenant...
    assert (
        "data residency (US)" in table[world.tenant_b.slug]["models"]["assistant"]["unavailable"]
    )  # ...in residency

    gpu_history(world, shared, hours=10, price="2.50")  # 25.00 of GPU time; acme: 50 completion tokens/hour
    UsageRecord.objects.update(completion_tokens=300)
    start = UsageRecord.objects.order_by("started_at").first().hour
    hourly_usage(world.tenant_b, shared, start, 10, prompt=500, completion=100)
    month = "2025-06"
    every = {
        r["tenant"]: Decimal(r["cost"])
        for r in api(world.operator).get(f"/api/v1/costs/?month={month}&group_by=tenant").json()["rows"]
    }
    # 40 % used each hour (300 + 100 of 1000): acme 30 %, globex 10 %, the rest is the platform's idle cost.
    assert every == {
        world.tenant_a.slug: Decimal("7.50"),
        world.tenant_b.slug: Decimal("2.50"),
        "(idle)": Decimal("15.00"),
    }
    mine = api(world.bob).get(f"/api/v1/costs/?month={month}&group_by=tenant").json()["rows"]
    assert [(r["tenant"], r["cost"]) for r in mine] == [(world.tenant_b.slug, "2.50")]
    assert Deployment.objects.get(pk=shared.pk).shared
