"""Rollouts on simulator engines in local process regions: the step machine, weights reaching the route
table, promotion through the registry's gate without an override, rollback, waves and the refusals."""

import os
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from core.errors import Conflict, InvalidTransition, NotFound, ValidationFailed
from core.models import AuditEvent
from regions.choices import TargetRole
from regions.models import DeploymentTarget
from registry.models import ModelVersion
from registry.services.lifecycle import version_transition
from rollouts import controller
from rollouts.models import Rollout
from rollouts.services import rollouts
from routing import services as routing
from tests.support.principals import principal
from tests.support.regions import converge
from tests.support.rollouts import candidate_of, drive, next_version, stage

pytestmark = pytest.mark.django_db(transaction=True)
OPEN = {"pause": {}}


def split_of(tenant: str = "acme", name: str = "chat") -> dict:
    route = routing.publish().body["tenants"][tenant]["models"][name]
    return route.get("splits", {})


def tracks(tenant: str = "acme", name: str = "chat") -> dict[str, str]:
    route = routing.publish().body["tenants"][tenant]["models"][name]
    return {e["url"]: e["track"] for e in route["endpoints"]}


def test_a_canary_walks_its_steps_and_switches_the_deployment(world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(
        actor=s.alice,
        deployment=s.deployment,
        version="2.0.0",
        steps=[{"set_weight": 10}, OPEN, {"set_weight": 50}],
    )
    s.candidate.refresh_from_db()
    assert rollout.state == "pending" and s.candidate.status == "canary"

    drive(rollout, {"paused"})
    assert split_of() == {"eu-west-1": {"candidate": 10, "mirror": 0}}
    assert sorted(tracks().values()) == ["candidate", "stable"]

    rollouts.rollout_resume(actor=s.alice, rollout=rollout)
    drive(rollout, {"succeeded"})
    s.candidate.refresh_from_db()
    s.deployment.refresh_from_db()
    assert s.deployment.version == s.candidate
    # No step was judged, so the rollout is no evidence for the production gate: the version stays canary.
    assert s.candidate.status == "canary"
    assert rollout.events.filter(kind="version", message__contains="stays canary").exists()
    with pytest.raises(Conflict, match="succeeded rollout"):
        version_transition(actor=s.alice, version=s.candidate, to="production")
    # The candidate revision is the stable one now; the baseline drains, out of the route table.
    assert split_of() == {} and list(tracks().values()) == ["stable"]
    old = DeploymentTarget.objects.get(deployment=s.deployment, role=TargetRole.RETIRING)
    assert old.version == s.baseline and old.remove_after is not None
    DeploymentTarget.objects.filter(pk=old.pk).update(remove_after=timezone.now() - timedelta(seconds=1))
    converge(s.deployment)
    old.refresh_from_db()
    assert old.status == "deleted"
    kinds = list(rollout.events.values_list("kind", flat=True))
    assert kinds[0] == "started" and kinds[-2:] == ["succeeded", "version"] and "weight" in kinds
    actions = set(AuditEvent.objects.filter(target_id=str(rollout.pk)).values_list("action", flat=True))
    assert {"rollout.started", "rollout.succeeded"} <= actions


def test_an_abort_takes_the_candidate_out_of_the_route_table_at_once(world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="2.0.0", steps=[{"set_weight": 50}, OPEN]
    )
    drive(rollout, {"paused"})
    before = routing.publish().generation
    assert split_of()
    rollouts.rollout_abort(actor=s.alice, rollout=rollout, reason="latency looks off")
    table = routing.selectors.current()
    assert table.generation == before + 1  # the rollback's own generation, published before it returned
    route = table.body["tenants"]["acme"]["models"]["chat"]
    assert "splits" not in route and {e["track"] for e in route["endpoints"]} == {"stable"}
    s.candidate.refresh_from_db()
    s.deployment.refresh_from_db()
    assert s.candidate.status == "staged" and s.deployment.version == s.baseline
    assert s.deployment.model.aliases.get(name="production").version == s.baseline
    assert candidate_of(s.deployment) is None  # retiring: its workload goes after the drain
    rollout.refresh_from_db()
    assert rollout.state == "aborted" and "latency looks off" in rollout.reason
    with pytest.raises(InvalidTransition):
        rollouts.rollout_resume(actor=s.alice, rollout=rollout)


def test_a_candidate_that_dies_fails_the_rollout_and_is_rejected_by_policy(
    world, make_region, tiny_model_dir
):
    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(
        actor=s.alice,
        deployment=s.deployment,
        version="2.0.0",
        steps=[{"set_weight": 10}, OPEN],
        on_failure="rejected",
    )
    drive(rollout, {"paused"})
    candidate = candidate_of(s.deployment)
    pid = _pid_of(candidate)
    os.killpg(pid, signal.SIGKILL)
    converge(s.deployment)
    controller.advance(rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == "failed" and "candidate" in rollout.reason
    assert ModelVersion.objects.get(pk=s.candidate.pk).status == "rejected"
    assert split_of() == {}


def test_a_failure_in_wave_two_rolls_back_wave_one_too(world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir, regions=("eu-west-1", "eu-central-1"))
    rollout = rollouts.rollout_start(
        actor=s.alice,
        deployment=s.deployment,
        version="2.0.0",
        steps=[{"set_weight": 20}, OPEN],
        waves=[["eu-west-1"], ["eu-central-1"]],
    )
    drive(rollout, {"paused"})
    rollouts.rollout_resume(actor=s.alice, rollout=rollout)
    drive(rollout, {"paused"})  # wave 2 in its pause; wave 1 now takes everything
    assert rollout.wave == 1
    assert split_of() == {
        "eu-west-1": {"candidate": 100, "mirror": 0},
        "eu-central-1": {"candidate": 20, "mirror": 0},
    }
    wave_two = DeploymentTarget.objects.get(
        deployment=s.deployment, role=TargetRole.CANDIDATE, region__code="eu-central-1"
    )
    os.killpg(_pid_of(wave_two), signal.SIGKILL)
    converge(s.deployment)
    controller.advance(rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == "failed"
    assert split_of() == {} and set(tracks().values()) == {"stable"}
    assert not DeploymentTarget.objects.filter(deployment=s.deployment, role=TargetRole.CANDIDATE).exists()


def test_a_controller_pass_twice_takes_a_step_once(world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="2.0.0", steps=[{"set_weight": 10}, OPEN]
    )
    drive(rollout, {"paused"})
    stale = Rollout.objects.get(pk=rollout.pk)
    stale.state, stale.step = "progressing", 0  # a worker that read the rollout before the step moved
    assert not controller._next_step(stale, timezone.now())
    assert rollout.events.filter(kind="weight").count() == 1


def test_refusals_write_nothing(world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir)
    cases = [
        ({"version": "9.9.9"}, NotFound),
        ({"version": "1.0.0"}, Conflict),
        ({"version": "2.0.0", "steps": [{"set_weight": 50}, {"set_weight": 20}]}, ValidationFailed),
        ({"version": "2.0.0", "steps": [{"set_weight": 0}]}, ValidationFailed),
        ({"version": "2.0.0", "steps": [{"set_weight": True}]}, ValidationFailed),
        ({"version": "2.0.0", "steps": [{"bogus": 1}]}, ValidationFailed),
        ({"version": "2.0.0", "steps": []}, ValidationFailed),
        ({"version": "2.0.0", "strategy": "blue_green", "steps": [{"set_weight": 5}]}, ValidationFailed),
        ({"version": "2.0.0", "waves": [["us-east-1"]]}, ValidationFailed),
        ({"version": "2.0.0", "waves": [["eu-west-1"], ["eu-west-1"]]}, ValidationFailed),
        ({"version": "2.0.0", "analysis": "fast please"}, ValidationFailed),
        ({"version": "2.0.0", "on_failure": "explode"}, ValidationFailed),
        ({"version": "2.0.0", "rollback_window_seconds": -1}, ValidationFailed),
    ]
    for fields, error in cases:
        with pytest.raises(error):
            rollouts.rollout_start(actor=s.alice, deployment=s.deployment, **fields)
    assert not Rollout.objects.exists()
    assert ModelVersion.objects.get(pk=s.candidate.pk).status == "staged"


def test_a_candidate_not_allowed_in_a_region_is_refused(world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir)
    next_version(s.alice, s.baseline, "3.0.0", allowed_jurisdictions=["US"])
    with pytest.raises(ValidationFailed, match="may not run in eu-west-1"):
        rollouts.rollout_start(actor=s.alice, deployment=s.deployment, version="3.0.0")
    assert not Rollout.objects.exists()


def test_two_rollouts_on_one_deployment_conflict(world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir)
    rollouts.rollout_start(actor=s.alice, deployment=s.deployment, version="2.0.0")
    next_version(s.alice, s.baseline, "3.0.0")
    with pytest.raises(Conflict, match="already has a rollout"):
        rollouts.rollout_start(actor=s.alice, deployment=s.deployment, version="3.0.0")


def test_production_still_needs_an_override_without_a_rollout(world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir)
    version_transition(actor=s.alice, version=s.candidate, to="canary")
    with pytest.raises(Conflict, match="succeeded rollout"):
        version_transition(actor=principal(world.alice), version=s.candidate, to="production")


def _pid_of(target: DeploymentTarget) -> int:
    import json
    from pathlib import Path

    from regions.workloads import target_workload

    folder = Path(target.region.driver_config["state_dir"]) / target_workload(target)
    (replica,) = sorted(folder.glob("replica-*.json"))
    return json.loads(replica.read_text())["pid"]


def test_deleting_the_deployment_aborts_its_rollout(world, make_region, tiny_model_dir):
    from regions.services.deployments import deployment_delete

    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(actor=s.alice, deployment=s.deployment, version="2.0.0")
    drive(rollout, {"progressing"})
    deployment_delete(actor=s.alice, deployment=s.deployment)
    controller.advance(rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == "aborted" and "deleted" in rollout.reason
    assert ModelVersion.objects.get(pk=s.candidate.pk).status == "staged"


def test_the_baseline_is_what_the_deployment_runs_now_not_what_the_caller_read(
    world, make_region, tiny_model_dir
):
    s = stage(world, make_region, tiny_model_dir)
    first = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="2.0.0", steps=[{"set_weight": 50}]
    )
    drive(first, {"succeeded"})
    next_version(s.alice, s.baseline, "3.0.0")
    second = rollouts.rollout_start(actor=s.alice, deployment=s.deployment, version="3.0.0")  # a stale read
    assert second.baseline.version == "2.0.0"


def test_a_wave_one_candidate_dying_during_wave_two_rolls_everything_back(world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir, regions=("eu-west-1", "eu-central-1"))
    rollout = rollouts.rollout_start(
        actor=s.alice,
        deployment=s.deployment,
        version="2.0.0",
        steps=[{"set_weight": 20}, OPEN],
        waves=[["eu-west-1"], ["eu-central-1"]],
    )
    drive(rollout, {"paused"})
    rollouts.rollout_resume(actor=s.alice, rollout=rollout)
    drive(rollout, {"paused"})
    assert rollout.wave == 1
    wave_one = DeploymentTarget.objects.get(
        deployment=s.deployment, role=TargetRole.CANDIDATE, region__code="eu-west-1"
    )
    os.killpg(_pid_of(wave_one), signal.SIGKILL)  # it takes all of eu-west-1's traffic now
    converge(s.deployment)
    controller.advance(rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == "failed" and "eu-west-1" in rollout.reason
    assert split_of() == {}


def test_two_passes_racing_to_roll_back_leave_one_rollback(world, make_region, tiny_model_dir):
    from rollouts.services import machine

    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="2.0.0", steps=[{"set_weight": 10}, OPEN]
    )
    drive(rollout, {"paused"})
    stale = Rollout.objects.get(pk=rollout.pk)
    machine.rollback(rollout, "failed", "the first pass")
    with pytest.raises(InvalidTransition):
        machine.rollback(stale, "failed", "the second pass, which read the rollout before")
    assert rollout.events.filter(kind="failed").count() == 1
    assert controller.advance(rollout.pk) == "failed"


def test_promoting_by_hand_moves_the_version_only_for_someone_who_may_override(
    world, make_region, tiny_model_dir
):
    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="2.0.0", steps=[{"set_weight": 10}, OPEN]
    )
    drive(rollout, {"paused"})
    dave = principal(world.dave)  # a developer: may change deployments, not skip a lifecycle gate
    rollouts.rollout_promote(actor=dave, rollout=rollout, reason="looks fine to me")
    s.deployment.refresh_from_db()
    s.candidate.refresh_from_db()
    assert rollout.state == "succeeded" and s.deployment.version == s.candidate
    assert s.candidate.status == "canary"  # no analysis, no override: the registry's gate is not passed

    next_version(s.alice, s.baseline, "3.0.0")
    second = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="3.0.0", steps=[{"set_weight": 10}, OPEN]
    )
    drive(second, {"paused"})
    rollouts.rollout_promote(actor=s.alice, rollout=second, reason="the canary is fine, ship it")
    third = ModelVersion.objects.get(model=s.baseline.model, version="3.0.0")
    assert third.status == "production"
    assert third.transitions.get(to_status="production").gate_override  # recorded as the override it is


def test_a_rollback_that_lands_first_leaves_no_candidate_to_start(world, make_region, tiny_model_dir):
    from rollouts.services import machine

    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(actor=s.alice, deployment=s.deployment, version="2.0.0")
    machine.rollback(rollout, "aborted", "changed my mind")
    assert machine.ensure_candidates(rollout, ["eu-west-1"]) == []  # a pass that read it as pending
    assert not DeploymentTarget.objects.filter(deployment=s.deployment, role=TargetRole.CANDIDATE).exists()


def test_a_deployment_is_not_scaled_during_its_rollout(world, make_region, tiny_model_dir):
    from regions.services.deployments import deployment_scale

    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="2.0.0", steps=[{"set_weight": 10}, OPEN]
    )
    drive(rollout, {"paused"})
    with pytest.raises(Conflict, match="being rolled out"):
        deployment_scale(actor=s.alice, deployment=s.deployment, replicas=2)


def test_a_candidate_deprecated_mid_rollout_is_rolled_back(world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="2.0.0", steps=[{"set_weight": 10}, OPEN]
    )
    drive(rollout, {"paused"})
    s.candidate.refresh_from_db()
    version_transition(actor=s.alice, version=s.candidate, to="deprecated", reason="security issue")
    controller.advance(rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == "failed" and "deprecated" in rollout.reason


def test_an_alias_moved_by_a_sibling_does_not_switch_a_deployment_that_rolled_it_back(
    world, make_region, tiny_model_dir
):
    from registry.services.lifecycle import alias_move

    s = stage(world, make_region, tiny_model_dir)
    alias_move(actor=s.alice, model=s.baseline.model, name="stable", version=s.baseline)
    s.deployment.follow_alias = "stable"
    s.deployment.save()
    rollout = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="2.0.0", steps=[{"set_weight": 10}, OPEN]
    )
    drive(rollout, {"paused"})
    rollouts.rollout_abort(actor=s.alice, rollout=rollout, reason="slow here")
    alias_move(
        actor=s.alice, model=s.baseline.model, name="stable", version=s.candidate
    )  # a sibling's success
    converge(s.deployment)
    s.deployment.refresh_from_db()
    assert s.deployment.version == s.baseline
