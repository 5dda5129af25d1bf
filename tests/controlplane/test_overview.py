"""The Overview is the fleet: regions with health and GPUs, deployment states, traffic, spend, failovers
and alerts, for an operator everything and for a tenant member only their own slice."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command

from billing.models import UsageRecord
from billing.selectors import spend_to_date, usage_rates
from controlplane import overview
from core.choices import Scope
from core.models import ApiToken, AuditEvent, User
from core.selectors import tokens_active, tokens_for
from core.services.tokens import may_manage_token, token_create, token_revoke
from regions.choices import TargetStatus
from regions.models import Deployment, Region
from regions.selectors import deployment_states, fleet_capacity
from routing.selectors import region_health
from tests.support.factories import ServiceAccountFactory, UserFactory
from tests.support.overview import NOW
from tests.support.principals import principal, system
from tests.support.processes import wait_for
from tests.support.regions import converge


def test_selectors_give_the_operator_the_whole_fleet(world, fleet):
    ops = principal(world.operator)
    assert deployment_states(ops) == {"ready": 1, "degraded": 0, "failed": 1, "starting": 0, "paused": 0}
    assert {(c["region"].code, c["used"], c["free"]) for c in fleet_capacity(ops)} == {
        ("eu-west-1", 1, 3),
        ("us-east-1", 1, 3),
    }
    health = region_health(ops)
    assert health["eu-west-1"] == {"state": "healthy", "healthy": 1, "unhealthy": 0}
    assert health["us-east-1"] == {"state": "degraded", "healthy": 0, "unhealthy": 1}
    rates = usage_rates(ops, now=NOW, window=timedelta(minutes=5))
    assert rates == {"requests_per_second": 90 / 300, "tokens_per_second": (30 * 150 + 60 * 300) / 300}
    assert spend_to_date(ops, now=NOW) == {
        "today": Decimal("42.00"),  # 12 h × 2.00 + 6 h × 3.00
        "month": Decimal("66.00"),  # 24 h × 2.00 + 6 h × 3.00
        "currency": "USD",
    }


def test_selectors_give_a_tenant_member_only_their_slice(world, fleet):
    alice = principal(world.alice)
    assert deployment_states(alice) == {"ready": 1, "degraded": 0, "failed": 0, "starting": 0, "paused": 0}
    # Pool sizes, and their own GPUs only: how much other tenants use is not theirs to see.
    assert {(c["region"].code, c["used"], c["free"]) for c in fleet_capacity(alice)} == {
        ("eu-west-1", 1, None),
        ("us-east-1", 0, None),
    }
    assert region_health(alice)["us-east-1"] == {"state": "healthy", "healthy": 0, "unhealthy": 0}
    rates = usage_rates(alice, now=NOW, window=timedelta(minutes=5))
    assert rates == {"requests_per_second": 30 / 300, "tokens_per_second": 30 * 150 / 300}
    assert spend_to_date(alice, now=NOW) == {
        "today": Decimal("24.00"),
        "month": Decimal("48.00"),
        "currency": "USD",
    }


def test_operator_overview_page_shows_the_fleet(client, world, fleet):
    client.force_login(world.operator)
    html = client.get("/").content.decode()
    for text in (
        "eu-west-1",
        "us-east-1",
        "1 used · 3 free of 4",
        "Deployments ready",
        "1 failed",
        "0.30",  # requests per second: 90 in 5 minutes
        "75.0",  # tokens per second: 22,500 in 5 minutes
        "42.00 USD",  # today
        "66.00 USD month to date",
        "acme/chat failed over to eu-central-1",
        "globex/globex-bot has no region",
        "engine exited with 137",
        "globex passed 80% of its 2026-06 budget",
    ):
        assert text in html, text


def test_tenant_member_overview_page_shows_only_their_slice(client, world, fleet):
    client.force_login(world.alice)
    html = client.get("/").content.decode()
    for text in ("eu-west-1", "us-east-1", "yours: 1 of 4", "0.10", "15.0", "24.00 USD", "48.00 USD month"):
        assert text in html, text
    for text in (
        "globex-bot",
        "globex",
        "66.00",
        "42.00",
        "engine exited",
        "free of",
        "has no region",
        "0.30",
    ):
        assert text not in html, text


def test_member_without_billing_or_deployment_scopes_gets_the_page_without_fleet(client, world, fleet):
    client.force_login(world.auditor)  # read scopes: sees the fleet, cannot change it
    assert b"1 used \xc2\xb7 3 free of 4" in client.get("/").content
    client.force_login(UserFactory(username="nobody"))
    response = client.get("/")
    assert response.status_code == 200 and b"eu-west-1" not in response.content


def test_active_tokens_counts_the_tokens_an_operator_manages(client, world, monkeypatch):
    """It said 0 for the operator while three tenant robot tokens existed (issue 11, section 9)."""
    robots = [world.robot_a, world.robot_b, ServiceAccountFactory(tenant=world.tenant_b, name="batch")]
    for robot in robots:
        token_create(actor=system(), name="app", scopes=[Scope.MODELS_INVOKE], service_account=robot)
    expiring, _ = token_create(
        actor=system(), name="old", scopes=[Scope.MODELS_INVOKE], service_account=robots[0]
    )
    revoked, _ = token_create(
        actor=system(), name="gone", scopes=[Scope.MODELS_INVOKE], service_account=robots[1]
    )
    token_revoke(actor=system(), token=revoked)
    ApiToken.objects.filter(pk=expiring.pk).update(expires_at=NOW - timedelta(days=1))

    assert tokens_active(principal(world.operator), now=NOW).count() == 3
    assert tokens_active(principal(world.alice), now=NOW).count() == 1  # robot_a's live one
    monkeypatch.setattr(overview, "clock", lambda: NOW)
    client.force_login(world.operator)
    html = client.get("/").content.decode()
    active = html.split('data-stat="active-tokens"><span class="num">', 1)[1]
    assert active.startswith("3<")


def test_the_token_list_and_the_revoke_rule_agree(world):
    """One rule: a token is listed to a caller exactly when the caller may revoke it."""
    platform_robot = ServiceAccountFactory(tenant=None, name="gateway", role="admin")
    for robot in (world.robot_a, world.robot_b):
        token_create(actor=system(), name="app", scopes=[Scope.MODELS_INVOKE], service_account=robot)
    # A platform robot belongs to no tenant, so its token cannot invoke models; it syncs gateways.
    token_create(actor=system(), name="app", scopes=[Scope.GATEWAY_SYNC], service_account=platform_robot)
    for user in (world.alice, world.bob, world.admin, world.operator, world.auditor, world.dave):
        token_create(actor=principal(user), name="mine", scopes=[Scope.TENANTS_READ])
    for user in (world.alice, world.bob, world.admin, world.operator, world.auditor, world.dave):
        p = principal(user)
        listed = set(tokens_for(p).values_list("pk", flat=True))
        allowed = {t.pk for t in ApiToken.objects.all() if may_manage_token(p, t)}
        assert listed == allowed, user.username


def test_seed_demo_leaves_a_deployment_and_some_usage_and_is_idempotent(db, settings, tmp_path, client):
    """A newcomer used to land on an empty fleet: no deployment, no usage, nothing on Costs or Routing."""
    settings.VAR_DIR = tmp_path
    call_command("seed_demo")
    chat = Deployment.objects.get(owner__slug="acme-eu", name="chat")
    assert [t.region.code for t in chat.targets.all()] == ["eu-west-1"]
    assert chat.model.ref == "platform/tiny-llama" and chat.version.version == "1.0.0"
    usage = UsageRecord.objects.filter(tenant__slug="acme-eu", deployment=chat)
    seeded = usage.count()
    assert seeded > 0 and usage.filter(region="eu-west-1", status=200).count() == seeded
    events = AuditEvent.objects.count()

    call_command("seed_demo")  # safe to run again: nothing is added twice
    assert Deployment.objects.filter(owner__slug="acme-eu").count() == 1
    assert usage.count() == seeded and AuditEvent.objects.count() == events

    client.force_login(User.objects.get(username="eu-admin"))
    html = client.get("/deployments/").content.decode()
    assert "chat" in html and "eu-west-1" in html


@pytest.mark.slow
def test_seeded_deployment_becomes_ready_on_the_simulator(transactional_db, settings, tmp_path, client):
    """Without vLLM (engine "auto" falls back to the simulator) the seeded chat converges to ready."""
    from pathlib import Path

    from regions.drivers.factory import default_state_dir, driver_for
    from regions.drivers.process import ProcessConfig

    settings.VAR_DIR = tmp_path
    call_command("seed_demo", "--engine", "simulator")  # what "auto" resolves to without vLLM installed
    region = Region.objects.get(code="eu-west-1")
    assert region.driver_config["engine"] == "simulator"
    chat = Deployment.objects.get(owner__slug="acme-eu", name="chat")
    try:

        def ready() -> bool:
            converge(chat)
            return chat.targets.get().status == TargetStatus.READY

        wait_for(ready, timeout=90, interval=1.0)
        client.force_login(User.objects.get(username="eu-admin"))
        html = client.get("/").content.decode()
        assert 'data-stat="deployments"><span class="num">1<' in html
    finally:
        root = Path(ProcessConfig.parse(dict(region.driver_config), default_state_dir("eu-west-1")).state_dir)
        for workload in root.glob("*") if root.exists() else []:
            driver_for(region).delete(workload.name)
