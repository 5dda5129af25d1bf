"""An operator watches a canary on its rollout page, pauses and resumes it, then aborts it with a reason."""

import pytest

from rollouts import controller
from rollouts.models import Rollout
from rollouts.services import rollouts
from tests.support.browser import login, shot
from tests.support.factories import PASSWORD
from tests.support.processes import wait_for
from tests.support.regions import converge
from tests.support.rollouts import stage

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]
HOUR = {"pause": {"seconds": 3600}}  # long enough that the rollout waits in it for the whole test


def at_first_pause(rollout: Rollout) -> Rollout:
    """Reconcile and advance until the candidate has its 10 % and the rollout waits in the timed pause."""

    def step() -> Rollout | None:
        converge(rollout.deployment)
        controller.advance(rollout.pk)
        rollout.refresh_from_db()
        return rollout if (rollout.state, rollout.step) == ("progressing", 1) else None

    return wait_for(step, timeout=60)


def test_operator_pauses_resumes_and_aborts_a_canary(page, world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="2.0.0", steps=[{"set_weight": 10}, HOUR]
    )
    at_first_pause(rollout)

    login(page, "ops", PASSWORD)
    page.click(".sidebar nav a[data-nav='Overview']")
    page.click(f"#active-rollouts a[href='/rollouts/{rollout.pk}/']")
    assert page.locator("#rollout-state").inner_text() == "progressing"
    weights = page.locator("#weights tr[data-region='eu-west-1']")
    assert weights.locator("[data-traffic]").inner_text() == "10 %"
    assert "ready" in weights.inner_text()
    steps = page.locator("#steps [data-wave='1']")
    assert steps.locator("[data-step='1']").get_attribute("data-state") == "done"
    assert steps.locator("[data-step='2']").get_attribute("data-state") == "current"
    assert "pause 3600 s, then analysis" in steps.locator("[data-step='2']").inner_text()
    assert steps.locator("[data-step='3']").get_attribute("data-state") == "next"
    shot(page, "60-rollout-progressing")

    page.fill("#action-pause input[name=reason]", "checking the dashboards")
    page.click("#action-pause button")
    assert page.locator("#rollout-state").inner_text() == "paused"
    assert page.locator("#rollout-reason").inner_text() == "checking the dashboards"
    assert page.locator("#action-pause").count() == 0
    page.click("#action-resume button")
    assert page.locator("#rollout-state").inner_text() == "progressing"
    assert "is progressing" in page.locator(".messages").inner_text()

    page.click("#action-abort button")  # no reason: the browser asks for one, nothing is sent
    assert page.locator("#rollout-state").inner_text() == "progressing"
    page.fill("#action-abort input[name=reason]", "TTFT p95 worse than the baseline")
    page.click("#action-abort button")
    assert page.locator("#rollout-state").inner_text() == "aborted"
    assert page.locator("#rollout-reason").inner_text() == "aborted by ops: TTFT p95 worse than the baseline"
    assert page.locator("#weights [data-traffic]").inner_text() == "0 %"
    assert page.locator("#rollout-actions").count() == 0
    assert "aborted" in page.locator("#rollout-events").inner_text()
    shot(page, "61-rollout-aborted")
    rollout.refresh_from_db()
    assert rollout.state == "aborted"
