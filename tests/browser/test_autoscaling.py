"""A tenant admin finds an autoscaled deployment from the Overview, reads its regions, timeline and decisions,
sets a policy through the form (a refusal first, next to its field), and cannot open another tenant's."""

from pathlib import Path

import pytest

from autoscaling import views
from autoscaling.models import AutoscalingPolicy
from controlplane import overview
from tests.support.autoscaling_console import LIMITED, NOW, scaled_fleet
from tests.support.browser import login, shot
from tests.support.factories import PASSWORD

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SCREENSHOT = Path("/tmp/console-autoscaling.png")  # the one the note shows


def test_tenant_admin_sets_a_policy_and_reads_the_timeline(
    page, world, make_region, tiny_model_dir, monkeypatch
):
    monkeypatch.setattr(views, "clock", lambda: NOW)
    monkeypatch.setattr(overview, "clock", lambda: NOW)
    fleet = scaled_fleet(world, make_region, tiny_model_dir, with_policy=False)

    login(page, "alice", PASSWORD)
    card = page.locator("#fleet-autoscaling")
    assert card.locator("[data-group=at_zero] [data-count]").inner_text() == "1"
    assert card.locator("[data-group=limited] [data-count]").inner_text() == "1"
    assert "globex" not in card.inner_text()  # bob's deployment is at zero and limited too: not counted
    shot(page, "70-overview-autoscaling")
    card.locator("[data-group=at_zero] a[data-deployment='acme/chat']").click()
    page.wait_for_selector("#scaling-timelines")
    assert page.url.endswith("/deployments/acme/chat/autoscaling/")
    assert page.locator("#policy-state").inner_text() == "off"

    west = page.locator("#scaling-regions tr[data-region='eu-west-1']")
    assert "2 ready / 2" in west.inner_text() and LIMITED in west.inner_text()
    assert page.locator("#scaling-regions tr[data-region='eu-central-1'] [data-badge=at-zero]").is_visible()
    chart = page.locator("#scaling-timelines [data-region='eu-west-1'] svg.scaling-chart")
    assert chart.get_attribute("data-samples") == "60"
    line = chart.locator("[data-line=replicas]").bounding_box()
    assert line is not None and line["width"] > 400 and line["height"] > 20  # drawn across the hour, stepping
    assert page.locator("#scaling-decisions tr[data-decision]").count() == 4

    # A refusal of the service lands next to the field it names; nothing is saved.
    page.fill("#id_min_replicas", "0")
    page.fill("#id_max_replicas", "0")
    page.fill("#id_running", "4")
    page.click("#save-policy")
    error = page.locator("[data-field=max_replicas] .error-text")
    assert "max_replicas must be at least min_replicas (and 1)" in error.inner_text()
    assert not AutoscalingPolicy.objects.filter(deployment=fleet.chat).exists()

    page.fill("#id_max_replicas", "3")
    page.fill("#id_overrides", '{"eu-west-1": {"max_replicas": 4}}')
    page.click("#save-policy")
    assert "The autoscaling policy of acme/chat is saved." in page.locator(".messages").inner_text()
    assert page.locator("#policy-state").inner_text() == "on"
    assert (
        page.locator("#policy-targets [data-target=running]").inner_text() == "running requests / replica 4"
    )
    # With a target, the chart draws it against running's line.
    assert (
        chart.locator("[data-line=target]").count() == 1 and chart.locator("[data-line=metric]").count() == 1
    )
    policy = AutoscalingPolicy.objects.get(deployment=fleet.chat)
    assert (policy.spec["min_replicas"], policy.spec["max_replicas"], policy.spec["running"]) == (0, 3, 4.0)
    assert policy.overrides == {"eu-west-1": {"max_replicas": 4}}
    shot(page, "71-autoscaling")
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    page.goto("/deployments/acme/chat/")
    summary = page.locator("#autoscaling-summary")
    assert "on" in summary.locator("[data-autoscaling]").inner_text() and LIMITED in summary.inner_text()

    # Another tenant's deployment: not found, as if it did not exist.
    response = page.goto("/deployments/globex/bot/autoscaling/")
    assert response is not None and response.status == 404
    assert "No deployment 'globex/bot'" in page.locator("main").inner_text()
