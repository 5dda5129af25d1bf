"""A tenant admin takes a version from draft to production in the console."""

import pytest

from registry.services.reports import report_submit
from tests.support.browser import login, shot
from tests.support.factories import PASSWORD
from tests.support.principals import principal
from tests.support.registry import GOOD_METRICS, register

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_version_from_draft_to_production(page, world, chat_model):
    version = register(chat_model, principal(world.alice), "1.0.0")
    report_submit(actor=principal(world.alice), version=version, **GOOD_METRICS)  # posted by CI

    login(page, "alice", PASSWORD)
    page.click(".sidebar nav a[data-nav='Registry']")
    page.click("#catalog >> text=acme/llama-3-8b")
    page.click("#versions >> text=1.0.0")
    assert page.locator("#version-status").inner_text() == "draft"
    assert "1 × L4" in page.locator("#smallest-fit").inner_text()
    assert "--enable-prefix-caching" in page.locator("#engine-flags").inner_text()
    shot(page, "10-version-draft")

    for state in ("validating", "validated", "staged", "canary"):
        page.click(f"form.transition[data-to='{state}'] button")
        assert page.locator("#version-status").inner_text() == state
    shot(page, "11-version-canary")

    production = page.locator("form.transition[data-to='production']")
    production.locator("button").click()
    assert "succeeded rollout" in page.locator(".messages").inner_text()  # the gate holds without an override
    production = page.locator("form.transition[data-to='production']")
    production.locator("input[name=reason]").fill("canary error rate 0.1% over 24h")
    production.locator("input[name=override]").check()
    production.locator("button").click()
    assert page.locator("#version-status").inner_text() == "production"
    timeline = page.locator("#timeline").inner_text()
    assert "gate override" in timeline and "canary error rate 0.1% over 24h" in timeline
    assert "passed" in page.locator("#validation").inner_text()
    shot(page, "12-version-production")

    page.click("text=← acme/llama-3-8b")
    assert "production" in page.locator("#versions").inner_text()
    shot(page, "13-model-page")
