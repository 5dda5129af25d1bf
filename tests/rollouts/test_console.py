"""The rollouts console: the list, a rollout's page (steps, weights, analysis runs, timeline), its actions
by role, the start form, the overview's active rollouts, and who may see or do what."""

import json
from html import unescape

import pytest

from core.models import AuditEvent
from rollouts import plan
from rollouts.models import AnalysisRun, Rollout
from rollouts.services import rollouts
from rollouts.views import chart
from tests.support.principals import principal
from tests.support.rollouts import drive, stage

pytestmark = pytest.mark.django_db(transaction=True)
OPEN = {"pause": {}}
PLAN = [{"set_weight": 10}, OPEN, {"set_weight": 50}]


def paused(world, make_region, tiny_model_dir, steps=PLAN):  # type: ignore[no-untyped-def]
    """acme/chat with a canary of 2.0.0 waiting in its open pause, 10 % on the candidate."""
    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(actor=s.alice, deployment=s.deployment, version="2.0.0", steps=steps)
    return drive(rollout, {"paused"})


def html_of(client, url: str, status: int = 200) -> str:  # type: ignore[no-untyped-def]
    response = client.get(url)
    assert response.status_code == status, response.content.decode()[:2000]
    return response.content.decode()


def post(client, url: str, data: dict | None = None, status: int = 302):  # type: ignore[no-untyped-def]
    response = client.post(url, data or {})
    assert response.status_code == status, response.content.decode()[:2000]
    return response


def shown(client, url: str) -> str:  # type: ignore[no-untyped-def]
    """The page a POST's redirect leads to, with the messages it left."""
    return html_of(client, url)


def test_the_rollout_page_shows_the_plan_where_it_is_and_the_buttons(
    client, world, make_region, tiny_model_dir
):
    rollout = paused(world, make_region, tiny_model_dir)
    client.force_login(world.alice)
    html = html_of(client, f"/rollouts/{rollout.pk}/")
    ref = rollout.candidate.model.ref
    assert f"{ref}@2.0.0" in html and f"{ref}@1.0.0" in html and "Canary" in html
    assert 'id="rollout-state">paused' in html
    assert "waiting for a person to resume" in html  # the reason
    # Steps of wave 1: 10 % done, the open pause is where it waits, 50 % and the end to come.
    assert 'data-step="1" data-state="done"' in html
    assert 'data-step="2" data-state="paused"' in html
    assert 'data-step="3" data-state="next"' in html
    assert 'data-step="4" data-state="next"' in html and "promote: the candidate becomes" in html
    # Weights per region, from the candidate target.
    assert 'data-region="eu-west-1"' in html and "<span data-traffic>10 %</span>" in html
    # The timeline.
    assert 'data-kind="started"' in html and 'data-kind="weight"' in html
    # What alice (tenant admin) may do in a pause: resume, promote, abort; not pause again.
    assert 'id="action-resume"' in html and 'id="action-abort"' in html and 'id="action-promote"' in html
    assert 'id="action-pause"' not in html
    # The deployment's page lists the rollout and marks the candidate revision beside the stable one.
    deployment = html_of(client, "/deployments/acme/chat/")
    assert (
        f'href="/rollouts/{rollout.pk}/"' in deployment and 'data-role="candidate">candidate r1' in deployment
    )


def test_pause_resume_abort_from_the_console_with_refusals_as_messages(
    client, world, make_region, tiny_model_dir
):
    rollout = paused(world, make_region, tiny_model_dir)
    client.force_login(world.dave)  # a developer of acme holds deployments:write
    url = f"/rollouts/{rollout.pk}/"

    post(client, url + "resume/")
    rollout.refresh_from_db()
    assert rollout.state == "progressing" and rollout.step == 2  # past the open pause
    html = shown(client, url)
    assert "is progressing" in html and 'id="action-pause"' in html

    post(client, url + "pause/", {"reason": "looking at the dashboards"})
    rollout.refresh_from_db()
    assert rollout.state == "paused" and rollout.reason == "looking at the dashboards"

    # Refusals are messages on the page, never a 500, and change nothing.
    post(client, url + "abort/", {"reason": "  "})
    assert "An abort needs a reason." in shown(client, url)
    post(client, url + "promote/", {"reason": ""})
    assert "Promoting by hand needs a reason." in shown(client, url)
    post(client, url + "pause/")
    assert f"Could not pause rollout {rollout.pk} of acme/chat: " in shown(client, url)
    post(client, url + "abort/", {"reason": "x" * 2001})
    assert "at most 2000 characters" in shown(client, url)
    nul = post(client, url + "abort/", {"reason": "bad\x00reason"}, status=400)
    assert "NUL characters are not allowed" in nul.content.decode()
    rollout.refresh_from_db()
    assert rollout.state == "paused"

    post(client, url + "abort/", {"reason": "TTFT looks worse on the graphs"})
    rollout.refresh_from_db()
    assert rollout.state == "aborted"
    html = shown(client, url)
    assert 'id="rollout-state">aborted' in html
    assert "aborted by dave: TTFT looks worse on the graphs" in html
    assert 'id="rollout-actions"' not in html  # nothing left to do
    assert 'data-step="3" data-state="stopped"' in html
    post(client, url + "resume/")  # the state machine refuses; the page says so
    html = shown(client, url)
    assert f"Could not resume rollout {rollout.pk} of acme/chat: " in html and "is aborted" in html
    actions = set(AuditEvent.objects.filter(target_id=str(rollout.pk)).values_list("action", flat=True))
    assert {"rollout.resumed", "rollout.paused", "rollout.aborted"} <= actions
    assert AuditEvent.objects.get(action="rollout.aborted").actor_name == "dave"


def test_promote_by_hand_needs_a_reason_and_ends_the_rollout(client, world, make_region, tiny_model_dir):
    rollout = paused(world, make_region, tiny_model_dir)
    client.force_login(world.operator)
    post(client, f"/rollouts/{rollout.pk}/promote/", {"reason": "signed off by the model owners"})
    rollout.refresh_from_db()
    assert rollout.state == "succeeded"
    html = shown(client, f"/rollouts/{rollout.pk}/")
    assert "promoted by ops: signed off by the model owners" in html
    # The candidate's revision is the stable one now, taking all of the region's requests.
    assert "<span data-traffic>100 %</span>" in html and "not started" not in html
    assert 'data-state="next"' not in html and 'data-state="paused"' not in html


def test_analysis_runs_show_both_sides_the_test_and_a_chart(client, world, make_region, tiny_model_dir):
    rollout = paused(world, make_region, tiny_model_dir)
    measurements = [
        {
            "metric": "ttft",
            "source": "gateway",
            "stat": "p95",
            "query": "usage records, track candidate vs stable",
            "candidate": 900.0,
            "baseline": 450.0,
            "candidate_samples": 200,
            "baseline_samples": 800,
            "test": "mann_whitney_u",
            "statistic": 12345.5,
            "p_value": 0.000123,
            "threshold": "candidate ≤ baseline × 1.1",
            "verdict": "failed",
            "reason": "candidate p95 900 > 495",
        },
        {
            "metric": "error_rate",
            "source": "gateway",
            "stat": "rate",
            "query": "",
            "candidate": None,  # no requests: no value, no chart
            "baseline": 0.01,
            "candidate_samples": 0,
            "baseline_samples": 800,
            "test": "",
            "statistic": None,
            "p_value": None,
            "threshold": "≤ 0.05",
            "verdict": "inconclusive",
            "reason": "too few samples",
        },
    ]
    run = AnalysisRun.objects.create(
        rollout=rollout,
        wave=0,
        step=1,
        region="eu-west-1",
        window_start=rollout.created_at,
        window_end=rollout.created_at,
        verdict="failed",
        measurements=measurements,
        message="ttft p95: failed",
    )
    client.force_login(world.vera)  # a viewer sees the analysis too
    html = html_of(client, f"/rollouts/{rollout.pk}/")
    assert f'data-run="{run.pk}" data-verdict="failed"' in html
    for text in ("ttft", "p95", "900", "450", "n = 200", "n = 800", "mann_whitney_u", "12,346", "0.000123"):
        assert text in html, text
    assert "candidate ≤ baseline × 1.1" in html and "candidate p95 900 &gt; 495" in html
    # The chart: the candidate's bar twice the baseline's, drawn by the app.
    assert 'width="140.0" height="12" fill="#b91c1c" data-bar="candidate"' in html
    assert 'width="70.0" height="12" fill="#94a3b8" data-bar="baseline"' in html
    assert html.count('class="measure-chart"') == 1 and "no value" in html  # error_rate has no chart
    # The step it judged carries the verdict in the steps timeline.
    assert "eu-west-1: failed" in html


def test_chart_scales_to_the_larger_side_and_skips_missing_values():
    assert chart({"candidate": 0.0, "baseline": 0.0, "verdict": "successful"})["candidate"] == 0.0
    drawn = chart({"candidate": 2, "baseline": 8, "verdict": "successful", "metric": "tps"})
    assert (drawn["candidate"], drawn["baseline"], drawn["color"]) == (35.0, 140.0, "#15803d")
    assert chart({"candidate": None, "baseline": 1.0}) is None
    assert chart({"candidate": "1", "baseline": 1.0}) is None
    assert chart({"candidate": True, "baseline": 1.0}) is None


def prefilled(html: str) -> object:
    """The steps textarea's content, as JSON."""
    text = html.split('name="steps"')[1].split(">", 1)[1].split("</textarea>")[0]
    return json.loads(unescape(text))


def test_the_start_form_prefills_the_strategys_plan_and_starts_a_rollout(
    client, world, make_region, tiny_model_dir
):
    s = stage(world, make_region, tiny_model_dir)
    client.force_login(world.alice)
    # The deployment page links to its rollouts and to the form.
    deployment_page = html_of(client, "/deployments/acme/chat/")
    assert "/rollouts/new/?deployment=acme/chat" in deployment_page and "No rollout yet" in deployment_page
    html = html_of(client, "/rollouts/new/?deployment=acme/chat")
    assert '<option value="2.0.0"' in html and '<option value="1.0.0"' not in html  # not the baseline
    assert prefilled(html) == plan.DEFAULT_STEPS["canary"]
    shadow = html_of(client, "/rollouts/new/?deployment=acme/chat&strategy=shadow")
    assert prefilled(shadow) == plan.DEFAULT_STEPS["shadow"]

    response = post(
        client,
        "/rollouts/new/?deployment=acme/chat",
        {
            "version": "2.0.0",
            "strategy": "canary",
            "steps": '[{"set_weight": 20}, {"pause": {}}]',
            "analysis": "",
            "waves": '[["eu-west-1"]]',
            "on_failure": "rejected",
        },
    )
    rollout = Rollout.objects.get()
    assert response.url == f"/rollouts/{rollout.pk}/"
    assert rollout.steps == [{"set_weight": 20}, {"pause": {}}] and rollout.on_failure == "rejected"
    assert rollout.created_by_name == "alice" and rollout.candidate == s.candidate
    assert "started: canary of 2.0.0 over 1.0.0" in shown(client, response.url)
    deployment_page = html_of(client, "/deployments/acme/chat/")
    assert f'href="/rollouts/{rollout.pk}/"' in deployment_page
    # A second one on the same deployment: the service's 409, as a message on the form.
    again = client.post(
        "/rollouts/new/?deployment=acme/chat",
        {"version": "2.0.0", "strategy": "canary", "on_failure": "staged"},
    )
    assert again.status_code == 400 and "already has a rollout in progress" in again.content.decode()
    assert Rollout.objects.count() == 1


BAD_INPUT = [
    ({"steps": "[{set_weight: 10}"}, "Not valid JSON: Expecting property name enclosed in double quotes"),
    ({"analysis": "{"}, "Not valid JSON"),
    ({"waves": "[[nope]]"}, "Not valid JSON"),
    ({"steps": '[{"set_weight": 10}]\x00'}, "NUL characters are not allowed, and a form field"),
    ({"version": "2.0.0\x00"}, "NUL characters are not allowed, and a form field"),
    ({"analysis": '{"metrics": [{"name": "ttft\\u0000"}]}'}, "NUL characters (\\u0000) are not allowed"),
    ({"steps": json.dumps([{"set_weight": 1}] * 5000)}, "at most 20000 characters"),
    ({"analysis": "[" * 15000 + "]" * 15000}, "at most 20000 characters"),
    ({"steps": "[" * 9000 + "]" * 9000}, "Nested deeper than 64 levels."),
    ({"waves": "[" * 100 + "]" * 100}, "Nested deeper than 64 levels."),
    ({"steps": '[{"set_weight": 50}, {"set_weight": 10}]'}, "weights must grow"),
    ({"steps": "[]"}, "steps must be a list of 1 to 50 steps."),
    ({"strategy": "blue_green", "steps": '[{"set_weight": 10}]'}, "a blue_green plan takes pause"),
    ({"strategy": "rainbow"}, "Select a valid choice."),
    ({"waves": '[["us-east-1"]]'}, "The deployment does not run in us-east-1."),
    ({"version": "9.9.9"}, "Select a valid choice."),
    ({"on_failure": "explode"}, "Select a valid choice."),
    ({"analysis": "[1, 2]"}, "must be an object"),
]


def test_bad_input_is_a_message_on_the_form_and_writes_nothing(client, world, make_region, tiny_model_dir):
    stage(world, make_region, tiny_model_dir)
    client.force_login(world.alice)
    good = {"version": "2.0.0", "strategy": "canary", "steps": "", "on_failure": "staged"}
    for change, message in BAD_INPUT:
        response = client.post("/rollouts/new/?deployment=acme/chat", {**good, **change})
        html = response.content.decode()
        assert response.status_code == 400, (change, response.status_code)
        assert message.replace('"', "&quot;") in html, (change, message)
    assert not Rollout.objects.exists()
    assert not AuditEvent.objects.filter(action="rollout.started").exists()
    # A body larger than the server reads at all: still an answer, not a 500.
    huge = client.post("/rollouts/new/?deployment=acme/chat", {**good, "analysis": "x" * 3_000_000})
    assert huge.status_code == 413 and "at most" in huge.content.decode()
    # A deployment named with junk is simply not there.
    for ref in ("acme", "acme/chat/x", "../etc", "acme/" + "x" * 500, "acme/chat\n"):
        assert client.get("/rollouts/new/", {"deployment": ref}).status_code == 404, ref
    assert client.get("/rollouts/new/", {"deployment": "acme/ch\x00at"}).status_code == 400


def test_the_list_puts_active_rollouts_first_and_filters_by_state(client, world, make_region, tiny_model_dir):
    rollout = paused(world, make_region, tiny_model_dir)
    rollouts.rollout_abort(actor=principal(world.alice), rollout=rollout, reason="first try")
    newer = rollouts.rollout_start(
        actor=principal(world.alice), deployment=rollout.deployment, version="2.0.0", steps=PLAN
    )
    # The finished one is made the newer of the two: active still comes first.
    Rollout.objects.filter(pk=rollout.pk).update(created_at=newer.created_at.replace(year=2099))
    client.force_login(world.alice)
    html = html_of(client, "/rollouts/")
    assert html.index(f'data-rollout="{newer.pk}"') < html.index(f'data-rollout="{rollout.pk}"')
    aborted = html_of(client, "/rollouts/?state=aborted")
    assert f'data-rollout="{rollout.pk}"' in aborted and f'data-rollout="{newer.pk}"' not in aborted
    junk = html_of(client, "/rollouts/?state=junk&page=-3")  # ignored, not an error
    assert f'data-rollout="{newer.pk}"' in junk
    assert 'data-nav="Rollouts"' in junk

    # The overview lists the active one, linked; the finished one is not there.
    overview = html_of(client, "/")
    section = overview.split('id="active-rollouts"')[1].split("</section>")[0]
    assert f'href="/rollouts/{newer.pk}/"' in section and f'href="/rollouts/{rollout.pk}/"' not in section
    client.force_login(world.bob)
    section = html_of(client, "/").split('id="active-rollouts"')[1].split("</section>")[0]
    assert "No rollout in progress." in section and "/rollouts/" + str(newer.pk) not in section


ACTIONS = [("pause", {}), ("resume", {}), ("abort", {"reason": "x"}), ("promote", {"reason": "x"})]


def test_another_tenant_neither_sees_nor_acts(client, world, make_region, tiny_model_dir):
    rollout = paused(world, make_region, tiny_model_dir)
    client.force_login(world.bob)
    assert f'data-rollout="{rollout.pk}"' not in html_of(client, "/rollouts/")
    assert "No rollouts yet." in html_of(client, "/rollouts/")
    assert "No rollout " in html_of(client, f"/rollouts/{rollout.pk}/", status=404)
    assert html_of(client, "/rollouts/999999/", status=404).count("No rollout ") == 1  # the same answer
    for action, data in ACTIONS:
        post(client, f"/rollouts/{rollout.pk}/{action}/", data, status=404)
    html_of(client, "/rollouts/new/?deployment=acme/chat", status=404)
    post(client, "/rollouts/new/?deployment=acme/chat", {"version": "2.0.0"}, status=404)
    rollout.refresh_from_db()
    assert rollout.state == "paused" and Rollout.objects.count() == 1


@pytest.mark.parametrize("who", ["vera", "auditor"])
def test_viewers_and_auditors_see_but_get_no_buttons_and_cannot_act(
    client, world, make_region, tiny_model_dir, who
):
    rollout = paused(world, make_region, tiny_model_dir)
    client.force_login(getattr(world, who))
    html = html_of(client, f"/rollouts/{rollout.pk}/")
    assert 'id="rollout-state">paused' in html and 'data-region="eu-west-1"' in html
    assert 'id="rollout-actions"' not in html and "csrfmiddlewaretoken" not in html.split("</header>")[1]
    assert f'data-rollout="{rollout.pk}"' in html_of(client, "/rollouts/")
    assert 'id="start-rollout"' not in html_of(client, "/deployments/acme/chat/")
    for action, data in ACTIONS:
        post(client, f"/rollouts/{rollout.pk}/{action}/", data, status=403)
    html_of(client, "/rollouts/new/?deployment=acme/chat", status=403)
    post(client, "/rollouts/new/?deployment=acme/chat", {"version": "2.0.0"}, status=403)
    rollout.refresh_from_db()
    assert rollout.state == "paused" and Rollout.objects.count() == 1
    assert not AuditEvent.objects.filter(action__in=["rollout.paused", "rollout.aborted"]).exists()


def test_anonymous_visitors_are_sent_to_sign_in(client, world):
    for url in ("/rollouts/", "/rollouts/1/", "/rollouts/new/?deployment=acme/chat"):
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith("/login/")
    assert client.post("/rollouts/1/abort/", {"reason": "x"}).status_code == 302
