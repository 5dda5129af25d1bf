"""A tenant admin sees its routes, a failover on the timeline and a what-if; another tenant sees none."""

import pytest

from routing import health
from tests.support.browser import login, shot
from tests.support.factories import PASSWORD
from tests.support.gateway import chat_in_two_eu_regions, kill_engines

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_routing_page_shows_table_failover_timeline_and_what_if(page, world, make_region, tiny_model_dir):
    deployment, regions = chat_in_two_eu_regions(
        world, make_region, tiny_model_dir, {"eu-west-1": "EU", "eu-central-1": "EU"}
    )
    health.cycle()
    kill_engines(regions["eu-west-1"], deployment)
    for _ in range(3):
        health.cycle()

    login(page, "alice", PASSWORD)
    page.click(".sidebar nav a[data-nav='Routing']")
    route = page.locator("#route-table").inner_text()
    assert "chat" in route and "eu-central-1" in route and "eu-west-1" not in route  # failed over
    timeline = page.locator("#routing-events").inner_text()
    assert "failover" in timeline and "traffic moved from eu-west-1 to eu-central-1" in timeline
    page.select_option("#what-if select", "eu-central-1")
    page.click("#what-if button")
    assert "loses service" in page.locator("#impact").inner_text()  # eu-west-1 is already down
    health_rows = page.locator("#endpoint-health").inner_text()
    assert "unhealthy" in health_rows and "/health failed" in health_rows  # the dead home engine
    shot(page, "40-routing")

    page.context.clear_cookies()
    login(page, "bob", PASSWORD)
    page.click(".sidebar nav a[data-nav='Routing']")
    assert "No deployments to route yet." in page.content()  # acme's routes are not bob's to see
    assert "traffic moved" not in page.locator("#routing-events").inner_text()
