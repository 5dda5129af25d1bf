"""The autoscaling console: a deployment's autoscaling page (policy, regions, timeline, decisions, the form
and its refusals), the summary on the deployment's page, the Overview's counts, and who may see or do what."""

import re
from datetime import timedelta
from html import unescape

import pytest

from autoscaling import console, views
from autoscaling.models import AutoscalingPolicy
from autoscaling.policy import Policy
from autoscaling.templatetags.scaling import figure
from controlplane import overview
from core.models import AuditEvent
from regions.models import DeploymentTarget
from tests.support.autoscaling_console import LIMITED, NOW, POLICY, samples, scaled_fleet
from tests.support.factories import UserFactory
from tests.support.principals import principal

URL = "/deployments/acme/chat/autoscaling/"
FORM = {
    "mode": "control_plane",
    "enabled": "on",
    "min_replicas": "1",
    "max_replicas": "3",
    "running": "6",
    "kv_cache": "0.8",
    "scale_down_stabilization_seconds": "120",
    "idle_seconds": "600",
}


@pytest.fixture(autouse=True)
def _now(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(views, "clock", lambda: NOW)
    monkeypatch.setattr(overview, "clock", lambda: NOW)


@pytest.fixture
def fleet(world, make_region, tiny_model_dir):  # type: ignore[no-untyped-def]
    return scaled_fleet(world, make_region, tiny_model_dir)


@pytest.fixture
def bare(world, make_region, tiny_model_dir):  # type: ignore[no-untyped-def]
    """The same fleet without any policy (decisions and samples stay)."""
    return scaled_fleet(world, make_region, tiny_model_dir, with_policy=False)


def html_of(client, url: str, status: int = 200) -> str:  # type: ignore[no-untyped-def]
    response = client.get(url)
    assert response.status_code == status, response.content.decode()[:3000]
    return response.content.decode()


def field_html(html: str, name: str) -> str:
    found = re.search(rf'<div class="field[^"]*" data-field="{name}">(.*?)</div>', html, re.S)
    assert found, f"no field {name} on the page"
    return unescape(found.group(1))


def section(html: str, element_id: str) -> str:
    found = re.search(rf'<(section|form|p)[^>]* id="{element_id}"[^>]*>(.*?)</\1>', html, re.S)
    assert found, f"no #{element_id} on the page"
    return unescape(found.group(2))


# --- what the owner sees ----------------------------------------------------------------------------
def test_the_owner_sees_the_policy_regions_timeline_and_decisions(client, world, fleet):
    client.force_login(world.alice)
    html = html_of(client, URL)
    assert 'id="policy-state">on' in html
    assert 'data-target="waiting"' in html and 'data-target="running"' in html
    regions = section(html, "scaling-regions")
    rows = dict(chunk.split('">', 1) for chunk in regions.split('<tr data-region="')[1:])
    west, central = rows["eu-west-1"], rows["eu-central-1"]
    assert "2 ready / 2" in west and LIMITED in west and 'data-badge="at-zero"' not in west
    # 4.5 running per replica against a target of 4 is past the 10 % tolerance: marked as over.
    assert re.search(r'<tr data-signal="running" class="over">.*?4\.5.*?target 4<', west, re.S)
    assert "0 ready / 0" in central and "at zero · wakes on request" in central
    assert f'<div class="msg error" id="capacity-limited">{LIMITED}</div>' in html

    timelines = section(html, "scaling-timelines")
    chart = re.search(
        r'<svg class="scaling-chart"[^>]*data-samples="60" data-metric="running">(.*?)</svg>', timelines, re.S
    )
    assert chart, "eu-west-1's hour of samples is drawn, against running (the signal it measured)"
    drawn = chart.group(1)
    assert drawn.count('data-line="replicas"') == 1 and drawn.count('data-line="metric"') == 1
    assert 'data-line="target"' in drawn and "against a target of 4" in drawn
    assert "Replicas 1 → 2 over the last hour" in drawn
    assert "<script" not in html and "cdn" not in html.lower()  # drawn by the app, no library
    # eu-central-1 has no state: said in words, not an empty chart.
    assert timelines.count("data-empty-timeline") == 1

    decisions = section(html, "scaling-decisions")
    assert decisions.count("<tr data-decision=") == 4  # acme's only; globex's is not here
    assert "2026-06-15 11:40:00" in decisions and "1 → 2" in decisions
    assert "running 6.2 per replica over its target 4" in decisions and "Scaled to zero (idle)" in decisions

    form = section(html, "policy-form")
    assert 'name="max_replicas"' in form and 'value="4"' in field_html(html, "max_replicas")
    assert 'id="stop-autoscaling"' in html


def test_the_timeline_draws_the_metric_asked_for_among_the_targets(client, world, fleet):
    client.force_login(world.dave)
    html = html_of(client, URL + "?metric=waiting")
    chart = re.search(r'<svg class="scaling-chart"[^>]*data-metric="waiting">(.*?)</svg>', html, re.S)
    assert chart is not None
    # No sample measured waiting: its target is drawn, no line of values.
    assert 'data-line="metric"' not in chart.group(1) and 'data-line="target"' in chart.group(1)
    assert 'data-metric="running">running</a>' in html
    # A metric the policy does not target, or garbage, falls back to the driving one.
    for asked in ("ttft_p95_seconds", "<script>", "x" * 500):
        assert 'data-metric="running">' in html_of(client, URL + f"?metric={asked}")
    # A NUL in the address is refused before the page (core's middleware), never a 500.
    assert "a %00 in the path or query" in html_of(client, URL + "?metric=run%00ning", status=400)


def test_without_a_policy_the_page_offers_the_defaults(client, world, bare):
    client.force_login(world.alice)
    html = html_of(client, URL)
    assert 'id="policy-state">off' in html and "No autoscaling policy" in html
    assert 'value="1"' in field_html(html, "min_replicas") and 'value="900"' in field_html(
        html, "idle_seconds"
    )
    assert "value=" not in field_html(html, "running").split("<small")[0]  # no target until one is chosen
    assert 'id="stop-autoscaling"' not in html
    # The decisions and samples stay readable without a policy; no target line then.
    assert 'data-samples="60"' in html and 'data-line="target"' not in html


# --- setting and stopping ---------------------------------------------------------------------------
def test_the_form_sets_the_policy_through_the_service_and_stop_removes_it(client, world, bare):
    client.force_login(world.dave)  # a developer holds deployments:write
    response = client.post(URL, FORM | {"overrides": '{"eu-west-1": {"max_replicas": 4}}'})
    assert response.status_code == 302 and response.url == URL
    policy = AutoscalingPolicy.objects.get(deployment=bare.chat)
    assert policy.enabled and policy.mode == "control_plane" and policy.updated_by_name == "dave"
    assert (
        policy.spec
        == Policy(
            min_replicas=1,
            max_replicas=3,
            running=6.0,
            kv_cache=0.8,
            scale_down_stabilization_seconds=120,
            idle_seconds=600,
        ).as_dict()
    )
    assert policy.overrides == {"eu-west-1": {"max_replicas": 4}}
    html = html_of(client, URL)
    assert "The autoscaling policy of acme/chat is saved." in html
    assert 'data-override="eu-west-1"' in html and 'value="600"' in field_html(html, "idle_seconds")
    assert AuditEvent.objects.filter(action="autoscaling.policy_set", actor_name="dave").count() == 1

    # Unchecking "enabled" keeps the policy, disabled.
    client.post(URL, {k: v for k, v in FORM.items() if k != "enabled"})
    policy.refresh_from_db()
    assert not policy.enabled and policy.overrides == {}
    assert 'id="policy-state">disabled' in html_of(client, URL)

    replicas = sorted(
        DeploymentTarget.objects.filter(deployment=bare.chat).values_list("desired_replicas", flat=True)
    )
    assert client.post(URL + "stop/").status_code == 302
    assert not AutoscalingPolicy.objects.filter(deployment=bare.chat).exists()
    assert (
        sorted(
            DeploymentTarget.objects.filter(deployment=bare.chat).values_list("desired_replicas", flat=True)
        )
        == replicas
    )
    html = html_of(client, URL)
    assert "Autoscaling of acme/chat stopped" in html and 'id="policy-state">off' in html
    # Stopping again (another tab): a message, not an error page.
    client.post(URL + "stop/")
    assert "has no autoscaling policy to stop" in html_of(client, URL)
    assert client.get(URL + "stop/").status_code == 405


QUOTA = "quota"


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"max_replicas": "0"}, "max_replicas", "max_replicas must be at least min_replicas"),
        ({"kv_cache": "1.5"}, "kv_cache", "kv_cache is a fraction of the KV cache: at most 1."),
        ({"running": "-2"}, "running", "running must be at least 0.001."),
        ({"tolerance": "1"}, "tolerance", "tolerance must be at least 0 and below 1."),
        ({"window_seconds": "5"}, "window_seconds", "must be between 15 and 1800 seconds"),
        ({"idle_seconds": "10"}, "idle_seconds", "must be between 60 seconds and 7 days"),
        ({"min_replicas": "two"}, "min_replicas", "Enter a whole number."),
        ({"scale_up_replicas": "1.5"}, "scale_up_replicas", "Enter a whole number."),
        ({"tolerance": "nan"}, "tolerance", "Enter a number."),
        ({"mode": "cron"}, "mode", "Select a valid choice."),
        ({"overrides": "{not json"}, "overrides", "Not valid JSON"),
        ({"overrides": "[1, 2]"}, "overrides", "overrides must be an object keyed by region code."),
        (
            {"overrides": '{"us-east-1": {"max_replicas": 2}}'},
            "overrides",
            "where this deployment does not run",
        ),
        (
            {"overrides": '{"eu-west-1": {"max_replicas": 99}}'},
            "overrides",
            "overrides.eu-west-1.max_replicas",
        ),
        ({"overrides": '{"eu-west-1": {"gpus": 2}}'}, "overrides", "gpus is not a policy field"),
        ({"overrides": "[" * 5000 + "]" * 5000}, "overrides", "Nested deeper than"),
        ({"max_replicas": "4", QUOTA: "2"}, "max_replicas", "more than acme's GPU quota of 2"),
    ],
)
def test_a_bad_value_is_shown_next_to_its_field_and_nothing_is_saved(
    client, world, bare, changes, field, message
):
    quota = changes.pop(QUOTA, None)
    if quota is not None:
        world.tenant_a.max_gpus = int(quota)
        world.tenant_a.save(update_fields=["max_gpus"])
    client.force_login(world.alice)
    response = client.post(URL, FORM | changes)
    assert response.status_code == 400, response.content.decode()[:3000]
    html = response.content.decode()
    shown = field_html(html, field)
    assert 'class="error-text"' in shown and message in shown, shown
    assert re.search(rf'<div class="field has-error[^"]*" data-field="{field}">', html)
    assert not AutoscalingPolicy.objects.exists()
    # The page around the form is all there: nothing of it is lost to a refusal.
    assert 'id="scaling-decisions"' in html and 'data-samples="60"' in html


def test_a_policy_with_no_target_is_refused_at_the_targets(client, world, bare):
    client.force_login(world.alice)
    response = client.post(URL, {k: v for k, v in FORM.items() if k not in ("running", "kv_cache")})
    assert response.status_code == 400
    group = re.search(
        r"<legend>Targets per replica.*?</legend>\s*<div[^>]*data-group-error>(.*?)</div>",
        response.content.decode(),
        re.S,
    )
    assert group and "needs at least one target: waiting, running, kv_cache, ttft_p95_seconds" in group.group(
        1
    )
    assert not AutoscalingPolicy.objects.exists()


@pytest.mark.parametrize(
    "changes",
    [
        {"min_replicas": "1\x00"},
        {"mode": "control_plane\x00"},
        {"overrides": '{"eu-west-1\x00": {"max_replicas": 2}}'},
        {"enabled\x00": "on"},
    ],
)
def test_a_nul_character_in_a_form_field_is_a_400_with_a_message(client, world, bare, changes):
    client.force_login(world.alice)
    response = client.post(URL, FORM | changes)
    assert response.status_code == 400
    assert "NUL characters are not allowed, and a form field contains one." in response.content.decode()
    assert not AutoscalingPolicy.objects.exists()


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        ('{"eu-west-1": {"max_replicas": "\\u0000"}}', "eu-west-1.max_replicas"),
        ('{"eu-\\u0000west-1": {}}', "a key"),
    ],
)
def test_a_nul_escaped_in_the_overrides_json_is_refused_at_the_overrides(
    client, world, bare, overrides, where
):
    client.force_login(world.alice)
    response = client.post(URL, FORM | {"overrides": overrides})
    assert response.status_code == 400, response.content.decode()[:3000]
    shown = field_html(response.content.decode(), "overrides")
    assert "NUL characters (\\u0000) are not allowed" in shown and where in shown
    assert not AutoscalingPolicy.objects.exists()


# --- who may see and do what ------------------------------------------------------------------------
def test_another_tenants_user_gets_404_for_every_address(client, world, fleet):
    before = AutoscalingPolicy.objects.get(deployment=fleet.chat).spec
    client.force_login(world.bob)
    assert "No deployment &#x27;acme/chat&#x27;" in html_of(client, URL, status=404)
    assert client.post(URL, FORM).status_code == 404
    assert client.post(URL + "stop/").status_code == 404
    assert AutoscalingPolicy.objects.get(deployment=fleet.chat).spec == before
    # And bob's own page shows his deployment, never acme's decisions.
    html = html_of(client, "/deployments/globex/bot/autoscaling/")
    assert html.count("<tr data-decision=") == 1 and 'data-region="eu-west-1"' not in html


def test_signed_out_visitors_are_sent_to_the_login(client, fleet):
    response = client.get(URL)
    assert response.status_code == 302 and response.url.startswith("/login/")
    assert client.post(URL + "stop/").status_code == 302
    assert AutoscalingPolicy.objects.filter(deployment=fleet.chat).exists()


def test_a_read_only_member_sees_the_page_but_no_form_and_a_post_is_refused(client, world, fleet):
    client.force_login(world.vera)  # viewer of acme: deployments:read only
    html = html_of(client, URL)
    assert 'id="policy-form"' not in html and 'id="stop-autoscaling"' not in html
    assert "changing it needs the deployments:write permission on acme" in html
    assert 'data-samples="60"' in html and 'id="scaling-decisions"' in html
    for url, data in ((URL, FORM | {"max_replicas": "1"}), (URL + "stop/", {})):
        response = client.post(url, data)
        assert response.status_code == 403
        assert "This action needs the &#x27;deployments:write&#x27; permission" in response.content.decode()
    assert AutoscalingPolicy.objects.get(deployment=fleet.chat).spec["max_replicas"] == POLICY["max_replicas"]


def test_an_operator_reads_any_tenants_page(client, world, fleet):
    client.force_login(world.operator)
    assert "acme/chat" in html_of(client, URL)


# --- the deployment's page and the Overview ---------------------------------------------------------
def test_the_deployment_page_links_autoscaling_with_a_one_line_summary(client, world, fleet):
    client.force_login(world.alice)
    summary = section(html_of(client, "/deployments/acme/chat/"), "autoscaling-summary")
    assert 'data-autoscaling="on"' in summary and "0 to 4 replicas per region" in summary
    assert "eu-central-1 at zero · wakes on request" in summary and LIMITED in summary
    assert f'href="{URL}"' in summary
    AutoscalingPolicy.objects.filter(deployment=fleet.chat).delete()
    summary = section(html_of(client, "/deployments/acme/chat/"), "autoscaling-summary")
    assert 'data-autoscaling="off"' in summary


def test_the_overview_counts_only_the_viewers_deployments(client, world, fleet):
    groups = {g.key: g for g in console.fleet_scaling(principal(world.alice), now=NOW)}
    assert {k: (g.count, [str(d) for d in g.deployments]) for k, g in groups.items()} == {
        "at_zero": (1, ["acme/chat"]),
        "scaling": (0, []),  # acme's last decision was 15 minutes ago
        "limited": (1, ["acme/chat"]),
    }
    everyone = {
        g.key: [str(d) for d in g.deployments]
        for g in console.fleet_scaling(principal(world.operator), now=NOW)
    }
    assert everyone == {
        "at_zero": ["acme/chat", "globex/bot"],
        "scaling": ["globex/bot"],
        "limited": ["acme/chat", "globex/bot"],
    }
    # Five minutes later globex's decision is no longer "now"; one that is not yet made does not count.
    later = console.fleet_scaling(principal(world.operator), now=NOW + timedelta(minutes=5))
    assert [g.count for g in later if g.key == "scaling"] == [0]
    earlier = console.fleet_scaling(principal(world.operator), now=NOW - timedelta(minutes=2))
    assert [g.count for g in earlier if g.key == "scaling"] == [0]

    client.force_login(world.alice)
    card = section(html_of(client, "/"), "fleet-autoscaling")
    assert "globex" not in card
    assert re.search(r'data-group="at_zero".*?data-count>1<.*?data-deployment="acme/chat"', card, re.S)
    assert re.search(r'data-group="scaling".*?data-count>0<', card, re.S)
    assert f'href="{URL}"' in card
    client.force_login(world.operator)
    card = section(html_of(client, "/"), "fleet-autoscaling")
    assert re.search(r'data-group="scaling".*?data-count>1<.*?data-deployment="globex/bot"', card, re.S)


def test_a_user_without_deployment_access_gets_no_autoscaling_card(client, fleet):
    client.force_login(UserFactory(username="nobody"))
    html = html_of(client, "/")
    assert 'id="fleet-autoscaling"' not in html


def points(text: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in (pair.split(",") for pair in text.split())]


# --- the drawing, as numbers ------------------------------------------------------------------------
def test_the_replicas_step_line_holds_each_count_until_the_next_sample():
    start = (NOW - timedelta(hours=1)).timestamp()
    rows = [[start, 1, {"running": 2.0}], [start + 1800, 3, {"running": 8.0}]]
    drawn = console.timeline(rows, now=NOW, policy=Policy(max_replicas=4, running=4), metric="running")
    assert drawn is not None
    f = drawn.frame
    mid = (f.left + f.x1) / 2
    one, three = f.y1 - (f.y1 - f.top) / 4, f.y1 - 3 * (f.y1 - f.top) / 4
    assert points(drawn.replicas_points) == [(f.left, one), (mid, one), (mid, three), (f.x1, three)]
    # The metric's axis runs to twice the target (8): the target sits halfway, 8 at the top.
    assert drawn.target_y == (f.y1 + f.top) / 2
    assert [points(s) for s in drawn.metric_segments] == [[(f.left, one), (mid, f.top)]]


def test_the_timeline_keeps_to_the_last_hour_and_to_well_formed_samples():
    hour_ago = (NOW - timedelta(hours=1, seconds=1)).timestamp()
    junk = [[hour_ago, 2, {}], ["x", 1], [NOW.timestamp(), True, {}], [NOW.timestamp() + 60, 1, {}], "row"]
    assert console.timeline(junk, now=NOW, policy=None, metric=None) is None
    assert console.timeline([], now=NOW, policy=None, metric=None) is None
    rows = [*junk, [NOW.timestamp() - 600, 2, {"running": "6", "waiting": 1}], [NOW.timestamp() - 300, 2, {}]]
    drawn = console.timeline(rows, now=NOW, policy=None, metric="waiting")
    assert drawn is not None and drawn.samples == 2 and drawn.target is None
    assert len(drawn.metric_segments) == 1  # the sample without a value breaks the line; "6" is not a number


def test_the_chosen_metric_is_the_one_driving_the_decision():
    policy = Policy(running=4, kv_cache=0.5)
    assert console.chosen_metric(policy, samples()) == "running"
    assert console.chosen_metric(policy, [[0, 1, {"running": 1.0, "kv_cache": 0.9}]]) == "kv_cache"
    assert console.chosen_metric(policy, [[0, 1, {"running": 1.0, "kv_cache": 0.9}]], "running") == "running"
    assert console.chosen_metric(policy, []) == "running"  # METRICS order when nothing was measured
    assert console.chosen_metric(None, [[0, 1, {"kv_cache": 0.2}]]) == "kv_cache"
    assert console.chosen_metric(None, []) is None


def test_figures_read_as_people_write_them():
    assert [figure(v) for v in (4.5, 4.0, 0.8200, 12, 123456.0, 1.2e-05, None, "", "n/a")] == [
        "4.5",
        "4",
        "0.82",
        "12",
        "123,456",
        "1.2e-05",
        "—",
        "—",
        "n/a",
    ]
