"""The Overview in a real browser: an operator sees the fleet's figures, a tenant admin only their own."""

import pytest

from tests.support.browser import login, shot
from tests.support.factories import PASSWORD

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_operator_sees_the_fleet_and_a_tenant_admin_their_slice(page, world, fleet):
    login(page, "ops", PASSWORD)
    assert page.locator("h1").inner_text() == "Overview"
    stats = page.locator("#fleet-stats")
    assert stats.locator("[data-stat=deployments] .num").inner_text() == "1"
    assert stats.locator("[data-state=failed]").inner_text() == "1 failed"
    assert stats.locator("[data-stat=requests] .num").inner_text() == "0.30"
    assert stats.locator("[data-stat=tokens] .num").inner_text() == "75.0"
    assert stats.locator("[data-stat=spend] .num").inner_text() == "42.00 USD"
    assert "66.00 USD" in stats.locator("[data-spend=month]").inner_text()
    eu = page.locator("#fleet tr[data-region='eu-west-1']")
    assert eu.locator("[data-health]").inner_text() == "healthy"
    assert "1 used · 3 free of 4" in eu.locator("[data-pool=L4]").inner_text()
    us = page.locator("#fleet tr[data-region='us-east-1']")
    assert us.locator("[data-health]").inner_text() == "degraded"
    assert page.locator("#alerts [data-alert=deployment]").count() == 1
    assert page.locator("#alerts [data-alert=budget]").count() == 1
    assert page.locator("#failovers [data-event=failover]").count() == 1
    shot(page, "03-overview-operator")

    page.context.clear_cookies()
    login(page, "alice", PASSWORD)
    assert page.locator("#fleet-stats [data-stat=spend] .num").inner_text() == "24.00 USD"
    assert "yours: 1 of 4" in page.locator("#fleet tr[data-region='eu-west-1']").inner_text()
    body = page.locator("main").inner_text()
    assert "globex" not in body and "66.00" not in body
    shot(page, "04-overview-tenant")
