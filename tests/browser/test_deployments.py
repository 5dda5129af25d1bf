"""A tenant admin deploys a catalog model to an allowed region in the console and watches it become ready."""

import threading

import pytest

from regions.models import Deployment
from regions.reconciler import reconcile_region
from tests.support.browser import login, shot
from tests.support.factories import PASSWORD
from tests.support.principals import principal
from tests.support.regions import tiny_version

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_tenant_deploys_to_an_allowed_region_and_sees_it_ready(page, world, make_region, tiny_model_dir):
    eu, us = make_region("eu-west-1", "EU"), make_region("us-east-1", "US")
    tiny_version(principal(world.operator), tiny_model_dir)

    login(page, "alice", PASSWORD)
    page.click(".sidebar nav a[data-nav='Regions']")
    assert page.locator("[data-region]").count() == 2
    shot(page, "20-regions")

    page.click(".sidebar nav a[data-nav='Deployments']")
    page.click("text=New deployment")
    placement = page.locator("#placement")
    assert "yes" in placement.locator("tr[data-region='eu-west-1']").inner_text()
    assert "outside acme's residency policy" in placement.locator("tr[data-region='us-east-1']").inner_text()
    assert page.locator("#deployment-form input[value='us-east-1']").count() == 0  # not even offered
    shot(page, "21-new-deployment")
    page.fill("#deployment-form input[name=name]", "support-bot")
    page.check("#deployment-form input[value='eu-west-1']")
    page.click("#deployment-form button[type=submit]")
    assert "support-bot" in page.locator("h1").inner_text()

    # The reconciler (a Celery worker in production) converges while the page refreshes itself.
    stop = threading.Event()

    def reconcile() -> None:
        while not stop.is_set():
            reconcile_region(eu.pk)
            stop.wait(0.5)

    worker = threading.Thread(target=reconcile, daemon=True)
    worker.start()
    try:
        page.wait_for_selector("#targets tr[data-region='eu-west-1'] .st-ready", timeout=30000)
    finally:
        stop.set()
        worker.join()
    assert "http://127.0.0.1:" in page.locator("#targets").inner_text()
    assert "provisioning → ready" in page.locator("#events").inner_text()
    shot(page, "22-deployment-ready")
    assert Deployment.objects.get(name="support-bot").targets.get().region_id == eu.pk
    assert not us.targets.exists()
