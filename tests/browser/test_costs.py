"""A tenant admin reads the month's costs: chart, table by region and version, idle GPUs, budget banner;
another tenant sees none of it."""

from decimal import Decimal

import pytest

from billing.models import BudgetAlert
from regions.services.deployments import deployment_create
from tests.support.billing import HISTORY, gpu_history
from tests.support.browser import login, shot
from tests.support.factories import PASSWORD
from tests.support.principals import principal
from tests.support.regions import converge, tiny_version

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_costs_page_shows_real_numbers_and_only_ones_own(page, world, make_region, tiny_model_dir):
    make_region("eu-west-1", "EU")
    version = tiny_version(principal(world.operator), tiny_model_dir)
    chat = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    converge(chat, passes=2)
    gpu_history(world, chat, hours=3, price="4.00")
    BudgetAlert.objects.create(
        tenant=world.tenant_a,
        period=HISTORY.strftime("%Y-%m"),
        threshold=80,
        spent=Decimal("12.00"),
        budget=Decimal("15.00"),
    )

    login(page, "alice", PASSWORD)
    page.click(".sidebar nav a[data-nav='Costs']")
    page.goto(f"/costs/?month={HISTORY.strftime('%Y-%m')}")  # a fixed past month: no test reads the date
    table = page.locator("#cost-table").inner_text()
    assert "eu-west-1" in table and "tiny-llama@1.0.0" in table and "12.00" in table  # 3 GPU-hours × 4.00
    assert page.locator("#cost-chart rect").count() >= 1
    assert "80% threshold" in page.locator("[data-budget-alert]").first.inner_text()
    shot(page, "50-costs")

    page.context.clear_cookies()
    login(page, "bob", PASSWORD)
    page.goto("/costs/")
    assert "tiny-llama" not in page.locator("#cost-table").inner_text()
    assert page.locator("[data-budget-alert]").count() == 0
