"""The fleet pass on PostgreSQL: signals from the probes' own storage, decisions written through the
deployment service (audited once, logged with the reason and the signals), stabilization across passes,
scale to zero, what it leaves alone, and growth placed cheapest first, spilled to a compliant region and
shrunk from the most expensive one."""

import itertools
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from autoscaling import evaluator, memory, selectors
from autoscaling.models import AutoscalingPolicy, ScalerState, ScalingDecision
from autoscaling.policy import Policy
from autoscaling.services.policies import policy_delete
from core.errors import Conflict
from core.models import AuditEvent, Tenant
from regions.models import DeploymentTarget, GpuPool, Region
from regions.services.deployments import deployment_scale, targets_scale
from rollouts import controller
from rollouts.services import rollouts
from tests.support.autoscaling import (
    NOW,
    autoscale,
    decisions,
    deploy,
    follow,
    price,
    replicas,
    request,
    serve,
    state,
    target,
)
from tests.support.principals import principal
from tests.support.regions import tiny_version
from tests.support.rollouts import next_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(world):  # type: ignore[no-untyped-def]
    return principal(world.alice)


@pytest.fixture
def version(world, alice, tiny_model_dir):  # type: ignore[no-untyped-def]
    return tiny_version(alice, tiny_model_dir, owner=world.tenant_a)


@pytest.fixture
def chat(make_region, alice, version):  # type: ignore[no-untyped-def]
    """acme/chat, one replica in eu-west-1 (a pool of 8 GPUs), autoscaled on 4 running per replica."""
    make_region("eu-west-1", "EU", gpus=8)
    deployment = deploy(alice, version, ["eu-west-1"])
    autoscale(alice, deployment, running=4, max_replicas=6)
    serve(deployment, "eu-west-1", running=0)
    return deployment


def test_a_busy_region_scales_up_and_the_decision_is_logged_once_with_its_reason_and_signals(chat):
    serve(chat, "eu-west-1", running=12)  # 12 in flight on one replica, 4 wanted per replica
    audits = AuditEvent.objects.count()
    report = evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 3}
    assert report.sources == {"eu-west-1": "probes"} and len(report.scaled) == 1
    (decision,) = decisions(chat)
    assert (decision.kind, decision.from_replicas, decision.to_replicas) == ("scale_up", 1, 3)
    assert "running 12 per replica against 4: 1 → 3" in decision.reason
    assert decision.signals == {"running": {"value": 12.0, "target": 4.0, "replicas": 3}}
    scaled = AuditEvent.objects.filter(action="deployment.autoscaled")
    assert AuditEvent.objects.count() == audits + 1 and scaled.count() == 1
    assert scaled.get().before == {"eu-west-1": 1} and scaled.get().after["eu-west-1"] == 3
    assert state(chat, "eu-west-1").changes == [[NOW.timestamp(), 1, 3]]


def test_within_the_tolerance_a_pass_writes_nothing(chat):
    serve(chat, "eu-west-1", running=4.2)
    evaluator.evaluate_all(now=NOW)  # the first pass records the state (and a timeline point)
    with CaptureQueriesContext(connection) as queries:  # inside the minute of that point: nothing is due
        report = evaluator.evaluate_all(now=NOW + timedelta(seconds=10))
    writes = [q["sql"] for q in queries if not q["sql"].lstrip().upper().startswith("SELECT")]
    assert writes == [] and report.scaled == []
    assert replicas(chat) == {"eu-west-1": 1} and not ScalingDecision.objects.exists()


def test_scaling_down_waits_for_the_stabilization_window_then_steps_one_replica_a_minute(chat):
    serve(chat, "eu-west-1", running=16)
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 4}
    seen = []
    for second in range(15, 480, 15):  # the load is gone: one replica would do
        follow(chat, running=0.5, at=NOW + timedelta(seconds=second))
        evaluator.evaluate_all(now=NOW + timedelta(seconds=second))
        seen.append((second, replicas(chat)["eu-west-1"]))
    held = [count for second, count in seen if second < 300]
    assert set(held) == {4}  # the 300 s window holds the 4 recommended at 0 s
    steps = [(s, c) for (s, c), (_, before) in zip(seen[1:], seen, strict=False) if c != before]
    assert [c for _, c in steps] == [3, 2, 1]  # then one replica at a time
    assert all(b - a >= 60 for (a, _), (b, _) in itertools.pairwise(steps))
    assert steps[0][0] >= 300
    assert [d.kind for d in decisions(chat)] == ["scale_up", "scale_down", "scale_down", "scale_down"]


def test_an_idle_deployment_with_min_zero_scales_to_zero_and_wakes_on_request(chat, alice):
    autoscale(alice, chat, running=4, min_replicas=0, idle_seconds=600)
    serve(chat, "eu-west-1", running=0)
    request(chat, "eu-west-1", NOW - timedelta(seconds=500))
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 1}  # a request 500 s ago: not idle yet
    evaluator.evaluate_all(now=NOW + timedelta(seconds=101))
    assert replicas(chat) == {"eu-west-1": 0}
    assert target(chat, "eu-west-1").wakes_on_request
    (decision,) = decisions(chat)
    assert decision.kind == "scale_to_zero" and "in the last 600 s" in decision.reason
    evaluator.evaluate_all(now=NOW + timedelta(seconds=200))  # at zero it stays there
    assert replicas(chat) == {"eu-west-1": 0} and len(decisions(chat)) == 1


def test_requests_answered_from_the_response_cache_do_not_keep_a_deployment_awake(chat, alice):
    autoscale(alice, chat, running=4, min_replicas=0, idle_seconds=600)
    serve(chat, "eu-west-1", running=0)
    request(chat, "eu-west-1", NOW - timedelta(seconds=700))
    request(chat, "eu-west-1", NOW - timedelta(seconds=5), track="cache")  # no engine ran for it
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 0}


def test_a_deployment_paused_by_hand_is_left_alone(chat, alice):
    deployment_scale(actor=alice, deployment=chat, replicas=0)
    serve(chat, "eu-west-1", running=50)
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 0} and not target(chat, "eu-west-1").wakes_on_request
    assert [d.kind for d in decisions(chat)] == ["manual"]


def test_a_deployment_in_a_rollout_is_left_alone(chat, alice, version):
    next_version(alice, version)
    rollout = rollouts.rollout_start(
        actor=alice, deployment=chat, version="2.0.0", steps=[{"set_weight": 20}], now=NOW
    )
    controller.advance(rollout.pk, now=NOW)
    assert chat.targets.filter(role="candidate").exists()
    serve(chat, "eu-west-1", running=50)
    report = evaluator.evaluate_all(now=NOW)
    assert report.deployments == 0 and replicas(chat) == {"eu-west-1": 1}
    assert not ScalingDecision.objects.exists()


# -- the fleet: cheapest first, spill, residency, quota, scale-in -------------------------------------------


@pytest.fixture
def fleet(make_region):  # type: ignore[no-untyped-def]
    """eu-west-1 (home, 2 GPUs, $2), eu-central-1 ($3), eu-north-1 ($2.50), ch-1 ($4) and us-east-1, the
    cheapest ($1) but outside acme's residency."""
    for code, jurisdiction, gpus, hourly in [
        ("eu-west-1", "EU", 2, "2.00"),
        ("eu-central-1", "EU", 8, "3.00"),
        ("eu-north-1", "EU", 8, "2.50"),
        ("ch-1", "CH", 8, "4.00"),
        ("us-east-1", "US", 8, "1.00"),
    ]:
        price(make_region(code, jurisdiction, gpus=gpus), hourly)


def test_a_full_pool_spills_to_the_cheapest_compliant_region_never_outside_residency(fleet, alice, version):
    chat = deploy(alice, version, ["eu-west-1"])
    autoscale(alice, chat, running=4, max_replicas=6)
    serve(chat, "eu-west-1", running=20)  # wants 5; the home pool has room for one more
    report = evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 2, "eu-north-1": 3}
    assert target(chat, "eu-north-1").overflow_of == "eu-west-1"
    assert not DeploymentTarget.objects.filter(region__code="us-east-1").exists()
    assert {(d.region.code, d.kind, d.to_replicas) for d in decisions(chat)} == {
        ("eu-west-1", "scale_out", 2),
        ("eu-north-1", "scale_out", 3),
    }
    assert "eu-west-1 is full: spilled to eu-north-1" in decisions(chat)[0].reason
    assert report.limited == []


def test_scale_in_takes_the_most_expensive_replicas_first(fleet, alice, version):
    chat = deploy(alice, version, ["eu-west-1"])
    autoscale(alice, chat, running=4, max_replicas=6, scale_down_stabilization_seconds=0)
    serve(chat, "eu-west-1", running=20)
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 2, "eu-north-1": 3}
    seen = []
    for second in range(60, 600, 61):
        follow(chat, running=0.5, at=NOW + timedelta(seconds=second))
        evaluator.evaluate_all(now=NOW + timedelta(seconds=second))
        seen.append(replicas(chat))
    assert seen[0] == {"eu-west-1": 2, "eu-north-1": 1}  # −1 per region and minute, from the spill region
    assert seen[-1] == {"eu-west-1": 1, "eu-north-1": 0}
    assert all(s["eu-west-1"] == 2 for s in seen if s["eu-north-1"] > 0)  # home shrinks only after


def test_the_tenants_gpu_quota_limits_growth_and_says_so(fleet, world, alice, version, api):
    world.tenant_a.max_gpus = 3
    world.tenant_a.save()
    chat = deploy(alice, version, ["eu-west-1"])
    autoscale(alice, chat, running=4, max_replicas=3)
    serve(chat, "eu-west-1", running=40)  # wants its max, 3: the home pool fits 2, the spill the third
    report = evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 2, "eu-north-1": 1} and report.limited == []
    assert state(chat, "eu-west-1").limited == ""
    later = NOW + timedelta(seconds=75)
    follow(chat, running=40, at=later)  # still overloaded everywhere, and the quota is spent
    report = evaluator.evaluate_all(now=later)
    assert replicas(chat) == {"eu-west-1": 2, "eu-north-1": 1}
    limited = state(chat, "eu-west-1").limited
    assert limited == "capacity-limited: 3 replica(s) more wanted, the tenant's GPU quota"
    assert report.limited == [f"acme/chat: {limited}"]
    body = api(world.alice).get("/api/v1/deployments/acme/chat/autoscaling/").json()
    assert body["capacity_limited"] == limited
    follow(chat, running=4, at=later + timedelta(seconds=15))  # demand met: the limit is cleared
    evaluator.evaluate_all(now=later + timedelta(seconds=15))
    assert state(chat, "eu-west-1").limited == ""
    assert api(world.alice).get("/api/v1/deployments/acme/chat/autoscaling/").json()["capacity_limited"] == ""


def test_a_deployment_that_cannot_grow_anywhere_says_so(fleet, alice, version):
    chat = deploy(alice, version, ["eu-west-1"])
    autoscale(alice, chat, running=4, max_replicas=6)
    for code in ("eu-central-1", "eu-north-1", "ch-1"):  # every compliant region is full
        GpuPool.objects.filter(region__code=code).update(gpu_count=0)
    serve(chat, "eu-west-1", running=20)
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 2}  # the one GPU left at home; us-east-1 never
    assert state(chat, "eu-west-1").limited == (
        "capacity-limited: 3 replica(s) more wanted, no GPUs free in any compliant region"
    )


def test_replicas_still_starting_are_not_demand_for_more(chat):
    """HPA's not-yet-ready pods: one busy replica and two starting ones already cover the load, however
    many passes run during the cold start."""
    serve(chat, "eu-west-1", running=12)
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 3}
    for second in (15, 30, 45, 60, 75, 90, 120):
        serve(chat, "eu-west-1", ready=1, running=12, at=NOW + timedelta(seconds=second))
        evaluator.evaluate_all(now=NOW + timedelta(seconds=second))
    assert replicas(chat) == {"eu-west-1": 3} and len(decisions(chat)) == 1
    follow(chat, running=4, at=NOW + timedelta(seconds=135))  # all three ready, 4 each: on target
    evaluator.evaluate_all(now=NOW + timedelta(seconds=135))
    assert replicas(chat) == {"eu-west-1": 3}


def test_a_probe_older_than_the_window_is_no_signal(chat):
    """The prober refreshes every second; a row it stopped refreshing (the router is down) is not load."""
    serve(chat, "eu-west-1", running=40, at=NOW - timedelta(minutes=10))
    report = evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 1} and report.scaled == []
    assert state(chat, "eu-west-1").signals == {}


def test_a_regions_own_idle_window_counts_requests_older_than_the_deployments(chat, alice):
    autoscale(
        alice,
        chat,
        running=4,
        min_replicas=0,
        idle_seconds=600,
        overrides={"eu-west-1": {"idle_seconds": 3600}},
    )
    serve(chat, "eu-west-1", running=0)
    request(chat, "eu-west-1", NOW - timedelta(seconds=1000))
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 1}
    evaluator.evaluate_all(now=NOW + timedelta(seconds=2700))
    assert replicas(chat) == {"eu-west-1": 0}


def test_two_deployments_wanting_the_last_gpus_of_a_pool_in_one_pass_both_grow(fleet, alice, version):
    """The second one sees what the first took: it spills in the same pass instead of failing to scale."""
    GpuPool.objects.filter(region__code="eu-west-1").update(gpu_count=3)
    first = deploy(alice, version, ["eu-west-1"], name="chat")
    second = deploy(alice, version, ["eu-west-1"], name="chat2")  # one GPU of the home pool left
    for deployment in (first, second):
        autoscale(alice, deployment, running=4, max_replicas=4)
        serve(deployment, "eu-west-1", running=8)  # each wants a second replica
    report = evaluator.evaluate_all(now=NOW)
    grown = sorted([replicas(first), replicas(second)], key=len)
    assert grown == [{"eu-west-1": 2}, {"eu-west-1": 1, "eu-north-1": 1}]
    assert len(report.scaled) == 2 and report.limited == []


def test_an_idle_group_goes_to_zero_without_waking_a_region_already_at_zero(fleet, alice, version):
    """Its overflow region, shrunk to zero earlier, is not idle but empty: a held request must wake the
    home region, so only the home is marked as woken by requests."""
    chat = deploy(alice, version, ["eu-west-1"])
    autoscale(alice, chat, running=4, min_replicas=0, idle_seconds=600)
    DeploymentTarget.objects.create(
        deployment=chat,
        region=Region.objects.get(code="eu-north-1"),
        desired_replicas=0,
        overflow_of="eu-west-1",
        status="paused",
        last_transition_at=NOW - timedelta(hours=2),
    )
    serve(chat, "eu-west-1", running=0)
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 0, "eu-north-1": 0}
    assert target(chat, "eu-west-1").wakes_on_request
    assert not target(chat, "eu-north-1").wakes_on_request
    assert [(d.region.code, d.kind) for d in decisions(chat)] == [("eu-west-1", "scale_to_zero")]


@pytest.mark.parametrize("in_sql", [True, False], ids=["appended-by-postgresql", "rewritten-by-django"])
def test_the_timeline_keeps_one_point_a_minute_for_an_hour(chat, monkeypatch, in_sql):
    monkeypatch.setattr(memory, "_appends_in_sql", lambda: in_sql)
    for minute in range(65):
        at = NOW + timedelta(minutes=minute)
        serve(chat, "eu-west-1", running=4, at=at)
        evaluator.evaluate_all(now=at)
        evaluator.evaluate_all(now=at + timedelta(seconds=15))  # inside the minute: no point
    samples = state(chat, "eu-west-1").samples
    assert len(samples) == 60
    assert {b[0] - a[0] for a, b in itertools.pairwise(samples)} == {60.0}  # one a minute
    assert samples[-1][0] >= (NOW + timedelta(minutes=64)).timestamp()  # the last hour's
    assert samples[-1][1:] == [1, {"running": 4.0, "waiting": 0.0, "kv_cache": 0.0}]
    assert state(chat, "eu-west-1").evaluated_at.timestamp() == samples[-1][0]


def test_the_fleets_timeline_points_are_spread_over_the_passes_of_a_minute(fleet, alice, version):
    deployments = [deploy(alice, version, ["eu-central-1"], name=f"chat{n}") for n in range(8)]
    for deployment in deployments:
        autoscale(alice, deployment, running=4)
    written = []
    for second in range(0, 240, 15):
        at = NOW + timedelta(seconds=second)
        for deployment in deployments:
            serve(deployment, "eu-central-1", running=4, at=at)
        evaluator.evaluate_all(now=at)
        written.append(ScalerState.objects.filter(evaluated_at=at).count())
    assert written[0] == 8  # the first pass: every state's first point
    assert written[4:] == [2] * 12  # then a quarter of them each pass, each one once a minute


def test_replicas_starting_in_the_spill_region_count_for_the_home_region_it_relieves(fleet, alice, version):
    """The home region and its overflow region share one tier: while the spilled replicas start, the home's
    load is what they will take, so passes during the cold start do not keep adding replicas there."""
    chat = deploy(alice, version, ["eu-west-1"])
    autoscale(alice, chat, running=4, max_replicas=6)
    serve(chat, "eu-west-1", running=20)  # 20 in flight: 5 replicas
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 2, "eu-north-1": 3}
    for second in (15, 30, 45, 60, 90):  # one home replica serves all 20; the other four are starting
        serve(chat, "eu-west-1", ready=1, running=20, at=NOW + timedelta(seconds=second))
        evaluator.evaluate_all(now=NOW + timedelta(seconds=second))
    assert replicas(chat) == {"eu-west-1": 2, "eu-north-1": 3}
    serve(chat, "eu-west-1", ready=1, running=32, at=NOW + timedelta(seconds=105))  # 32: 8 replicas now
    evaluator.evaluate_all(now=NOW + timedelta(seconds=105))
    assert sum(replicas(chat).values()) == 8


def test_a_target_behind_one_service_endpoint_is_sized_by_its_ready_replicas(chat):
    """A Kubernetes target lists one Service URL for all its pods; its probe reads one pod's gauges."""
    DeploymentTarget.objects.filter(deployment=chat).update(desired_replicas=3)
    serve(chat, "eu-west-1", ready=1, running=8)
    DeploymentTarget.objects.filter(deployment=chat).update(ready_replicas=3)
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"eu-west-1": 6}  # ceil(3 × 8 / 4), not one replica's share of it


def test_a_region_residency_now_refuses_never_grows_and_its_load_spills_to_a_compliant_one(
    fleet, world, alice, version
):
    wider = next_version(alice, version, "1.1.0", status="production", allowed_jurisdictions=["EU", "CH"])
    chat = deploy(alice, wider, ["ch-1"])
    autoscale(alice, chat, running=4, max_replicas=6)
    world.tenant_a.residency = ["EU"]  # narrowed since chat was placed in ch-1
    world.tenant_a.save()
    serve(chat, "ch-1", running=12)
    evaluator.evaluate_all(now=NOW)
    assert replicas(chat) == {"ch-1": 1, "eu-west-1": 2}  # the 2 more in the cheapest EU region
    assert target(chat, "eu-west-1").overflow_of == "ch-1"
    with pytest.raises(Conflict) as refused:  # and the service refuses it whoever asks
        targets_scale(actor=alice, deployment=chat, replicas={"ch-1": 2}, reason="by hand", kind="manual")
    assert refused.value.code == "residency" and "outside acme's residency policy" in str(refused.value)


def test_a_capacity_limit_is_forgotten_once_the_policy_is_disabled_or_deleted(fleet, world, alice, version):
    chat = deploy(alice, version, ["eu-west-1"])
    Tenant.objects.filter(pk=world.tenant_a.pk).update(max_gpus=1)  # its one replica fills the quota
    for stop in ("disable", "delete"):
        autoscale(alice, chat, running=4, max_replicas=1)
        # Saved when the quota was higher (it was lowered since): the policy wants more than it allows.
        AutoscalingPolicy.objects.filter(deployment=chat).update(
            spec=Policy(running=4, max_replicas=4).as_dict()
        )
        serve(chat, "eu-west-1", running=40)
        evaluator.evaluate_all(now=NOW)
        assert "the tenant's GPU quota" in state(chat, "eu-west-1").limited
        if stop == "disable":
            autoscale(alice, chat, running=4, max_replicas=1, enabled=False)
        else:
            policy_delete(actor=alice, deployment=chat)
        assert state(chat, "eu-west-1").limited == "" and selectors.capacity_limited(chat) == ""


def test_one_deployments_trouble_never_stops_the_pass_for_the_others(chat, alice, version, make_region):
    make_region("eu-central-1", "EU", gpus=8)
    broken = deploy(alice, version, ["eu-central-1"], name="broken")
    autoscale(alice, broken, running=4)
    AutoscalingPolicy.objects.filter(deployment=broken).update(spec={"running": "four"})  # unreadable
    serve(broken, "eu-central-1", running=12)
    serve(chat, "eu-west-1", running=12)
    report = evaluator.evaluate_all(now=NOW)
    assert report.failed == [str(broken)]
    assert replicas(chat) == {"eu-west-1": 3}
