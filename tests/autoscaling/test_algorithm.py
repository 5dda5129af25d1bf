"""The per-region decision, against Kubernetes' HPA v2 algorithm as its documentation states it
(kubernetes.io, "Horizontal Pod Autoscaling": algorithm details, stabilization window, scaling policies,
and the conservative treatment of not-yet-ready pods), on vLLM's signals. Pure: no database, the clock
passed in."""

from dataclasses import replace

import pytest

from autoscaling.algorithm import decide, per_metric, rate_limit, stabilize
from autoscaling.choices import DecisionKind
from autoscaling.policy import Policy

T0 = 1_800_000_000.0  # any instant: the algorithm only compares epochs it is given
RUNNING = Policy(min_replicas=1, max_replicas=20, running=4.0)


def run(policy: Policy, current: int, values: dict[str, float], **kw):  # type: ignore[no-untyped-def]
    kw = {"idle_seconds": 0.0, "history": [], "changes": [], "now": T0, **kw}
    return decide(policy, current, values, **kw)


# -- the recommendation: ceil(current × value / target), the tolerance, several metrics --------------------


@pytest.mark.parametrize(
    ("current", "value", "wanted"),
    [
        (1, 8.0, 2),  # HPA docs: 200m against 100m doubles the replicas
        (4, 2.0, 2),  # 50m against 100m halves them
        (3, 5.0, 4),  # ceil(3 × 1.25) = ceil(3.75)
        (3, 4.36, 3),  # ratio 1.09: inside the 10 % tolerance, no change
        (3, 3.64, 3),  # ratio 0.91: inside it on the way down too
        (3, 4.5, 4),  # ratio 1.125: outside, ceil(3.375)
        (10, 4.0, 10),  # exactly on target
        (2, 6.0, 3),  # ceil(2 × 1.5) exactly 3, not 4 (no float rounding up)
    ],
)
def test_the_recommendation_is_hpas_ceil_of_current_times_ratio(current, value, wanted):
    assert per_metric(RUNNING, current, {"running": value})["running"]["replicas"] == wanted


def test_within_the_tolerance_nothing_changes_and_a_wider_tolerance_holds_more():
    assert run(RUNNING, 5, {"running": 4.39}).replicas == 5
    assert run(RUNNING, 5, {"running": 4.41}).replicas == 6
    loose = replace(RUNNING, tolerance=0.3)
    assert run(loose, 5, {"running": 5.1}).replicas == 5
    assert run(loose, 5, {"running": 5.3}).kind == DecisionKind.SCALE_UP


def test_with_several_metrics_the_largest_recommendation_wins():
    policy = replace(RUNNING, waiting=1.0, kv_cache=0.8)
    decision = run(policy, 2, {"running": 4.0, "waiting": 3.0, "kv_cache": 0.4})
    assert decision.signals["running"]["replicas"] == 2
    assert decision.signals["waiting"]["replicas"] == 6
    assert decision.signals["kv_cache"]["replicas"] == 1
    assert decision.replicas == 6 and decision.kind == DecisionKind.SCALE_UP
    assert "waiting 3 per replica against 1" in decision.reason


def test_a_metric_without_a_value_asks_for_nothing_and_no_signal_at_all_keeps_the_replicas():
    policy = replace(RUNNING, waiting=1.0)
    assert set(run(policy, 2, {"running": 12.0}).signals) == {"running"}
    decision = run(policy, 3, {}, history=[[T0 - 30, 3.0]])
    assert decision.replicas == 3 and decision.kind == "" and "no signal" in decision.reason
    assert decision.recommendations == [[T0 - 30, 3.0]]  # the stabilization memory is kept as it was


def test_replicas_not_ready_yet_count_as_idle_on_the_way_up():
    """HPA: with not-yet-ready pods, a scale-up is recomputed with them at 0 % of the target, and cancelled
    when the recomputed ratio is inside the tolerance. Here: 4 replicas wanted, 1 ready and busy at 8
    running against a target of 2; the 3 starting ones take a share of that load once ready."""
    policy = Policy(max_replicas=20, running=2.0, scale_up_replicas=20)
    assert run(policy, 4, {"running": 8.0}, ready=1).replicas == 4  # (8 + 0 + 0 + 0) / 4 = 2: on target
    assert run(policy, 4, {"running": 12.0}, ready=1).replicas == 6  # ceil(12 / 2)
    assert run(policy, 4, {"running": 8.0}, ready=4).replicas == 16  # all ready: ceil(4 × 4)


def test_on_the_way_down_replicas_not_ready_are_left_out():
    """HPA: below the target, the ready pods alone are sized (ceil(ratio × ready))."""
    policy = replace(RUNNING, scale_down_stabilization_seconds=0, scale_down_replicas=10)
    assert run(policy, 4, {"running": 2.0}, ready=2).replicas == 1  # ceil(0.5 × 2)
    assert run(policy, 4, {"running": 3.8}, ready=2).replicas == 4  # ratio 0.95: inside the tolerance


# -- stabilization ------------------------------------------------------------------------------------------


def test_scaling_up_is_immediate_with_the_default_zero_second_window():
    decision = run(RUNNING, 2, {"running": 8.0}, history=[[T0 - 600, 2.0]])
    assert decision.replicas == 4 and decision.kind == DecisionKind.SCALE_UP


def test_scaling_down_holds_the_highest_recommendation_of_the_last_300_seconds_then_drops():
    history: list[list[float]] = []
    replicas = 1
    for at, value in [(0, 16.0), (60, 1.0), (120, 2.0)]:  # recommendations 4, then 1, then 2
        decision = run(RUNNING, replicas, {"running": value}, history=history, now=T0 + at)
        replicas, history = decision.replicas, decision.recommendations
    assert replicas == 4  # up at once, then held at 4: the 300 s window still holds the 4
    for at in (299, 359):
        held = run(RUNNING, 4, {"running": 2.0}, history=history, now=T0 + at)
        assert held.replicas == 4 and "4 → 2, held at 4 by the stabilization window" in held.reason
    # The 4 was the recommendation until 60 s; 300 s later it leaves the window and the 2 (since 120 s)
    # is the highest left: down to 2, one replica a minute (the rate limit).
    later = run(RUNNING, 4, {"running": 2.0}, history=history, now=T0 + 361)
    assert later.replicas == 3 and later.kind == DecisionKind.SCALE_DOWN
    assert "4 → 2, 3 by the rate limit" in later.reason
    last = run(RUNNING, 3, {"running": 2.0}, history=later.recommendations, now=T0 + 430)
    assert last.replicas == 2


def test_stabilization_matches_hpas_min_max_over_the_window():
    """HPA: up = min of the up window's recommendations, down = max of the down window's; the result is
    current raised to up, lowered to down."""
    policy = replace(RUNNING, scale_up_stabilization_seconds=120, scale_down_stabilization_seconds=300)
    history = [[T0 - 200.0, 6.0], [T0 - 100.0, 3.0], [T0 - 50.0, 5.0]]
    # The up window (the last 120 s) saw 6 (until −100 s), 3, 5 and now 8: min 3; the down window: max 8.
    stable, kept = stabilize(policy, 4, 8, history, T0)
    assert stable == 4  # max(4, 3) = 4, min(4, 8) = 4: the up window's 3 holds an up-scale back
    assert kept[-1] == [T0, 8]
    # Nothing older than the longest window is kept, except the point in force at its start.
    _, pruned = stabilize(policy, 4, 8, [[T0 - 900.0, 9.0], *history], T0)
    assert pruned[0] == [T0 - 900.0, 9.0]
    _, pruned = stabilize(policy, 4, 8, [[T0 - 900.0, 9.0], [T0 - 400.0, 2.0], *history], T0)
    assert pruned[0] == [T0 - 400.0, 2.0]


# -- rate limits --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "desired", "allowed"),
    [
        (1, 20, 5),  # +4 replicas beats +100 % (1 → 2)
        (3, 20, 7),  # +4 (7) beats +100 % (6)
        (10, 40, 20),  # +100 % (20) beats +4 (14)
        (10, 12, 12),  # within both
    ],
)
def test_scale_up_is_at_most_plus_100_percent_or_plus_4_per_period_whichever_is_more(
    current, desired, allowed
):
    assert rate_limit(RUNNING, current, desired, [], T0) == allowed


def test_scale_up_counts_from_the_replicas_at_the_periods_start():
    """HPA: periodStartReplicas = current − replicas added within the period."""
    changes = [[T0 - 50, 1, 4]]  # +3 fifty seconds ago: the period started at 1
    assert rate_limit(RUNNING, 4, 20, changes, T0) == 5  # 1 + 4
    assert rate_limit(RUNNING, 5, 20, [[T0 - 50, 1, 5]], T0) == 5  # used up: hold until it ages out
    assert rate_limit(RUNNING, 5, 20, [[T0 - 60, 1, 5]], T0) == 10  # 60 s ago is outside the period


def test_scale_down_is_at_most_one_replica_per_period():
    assert rate_limit(RUNNING, 8, 2, [], T0) == 7
    assert rate_limit(RUNNING, 7, 2, [[T0 - 30, 8, 7]], T0) == 7  # already −1 this period
    assert rate_limit(RUNNING, 7, 2, [[T0 - 61, 8, 7]], T0) == 6
    faster = replace(RUNNING, scale_down_replicas=3, scale_down_period_seconds=30)
    assert rate_limit(faster, 8, 2, [[T0 - 20, 9, 8]], T0) == 6  # 9 − 3


def test_the_rate_limit_applies_inside_decide():
    decision = run(RUNNING, 2, {"running": 40.0})  # wants 20
    assert decision.replicas == 6 and "6 by the rate limit" in decision.reason


# -- bounds and zero ----------------------------------------------------------------------------------------


def test_min_and_max_bound_the_result():
    bounded = replace(RUNNING, min_replicas=2, max_replicas=5, scale_down_stabilization_seconds=0)
    assert run(bounded, 4, {"running": 40.0}).replicas == 5
    assert run(bounded, 3, {"running": 0.0}).replicas == 2
    assert run(bounded, 2, {"running": 0.0}).kind == ""  # at the floor: nothing to do


def test_scale_to_zero_after_the_idle_window_only_when_min_replicas_is_zero():
    scalable = replace(RUNNING, min_replicas=0, idle_seconds=900)
    busy = run(scalable, 2, {"running": 0.0}, idle_seconds=899, history=[[T0 - 60, 2.0]])
    assert busy.replicas == 2 and busy.kind == ""
    idle = run(scalable, 2, {"running": 0.0}, idle_seconds=900)
    assert idle.replicas == 0 and idle.kind == DecisionKind.SCALE_TO_ZERO and "900" in idle.reason
    assert idle.recommendations == []
    kept = run(replace(scalable, min_replicas=1), 2, {"running": 0.0}, idle_seconds=90_000)
    assert kept.replicas == 1  # min 1 never goes to zero, however long idle (only down to the floor)
    # Not idle, min 0: sized by its signals like any other, but never below one replica.
    assert run(replace(scalable, scale_down_stabilization_seconds=0), 2, {"running": 0.0}).replicas == 1


def test_a_region_at_zero_stays_at_zero_whatever_the_signals():
    decision = run(RUNNING, 0, {"running": 100.0}, history=[[T0 - 10, 3.0]])
    assert decision.replicas == 0 and decision.kind == ""
    assert decision.recommendations == [[T0 - 10, 3.0]]
