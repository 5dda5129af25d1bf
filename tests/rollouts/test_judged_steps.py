"""Judged pauses end in analysis runs on the gateway's own records: a slower candidate is rolled back, an
equal one promoted, too little traffic pauses for a person; the clock is passed in."""

import random
from datetime import timedelta

import pytest

from billing.services import usage_ingest
from core.errors import ValidationFailed
from rollouts import controller
from rollouts.models import AnalysisRun, Rollout
from rollouts.services import rollouts
from tests.support.principals import system
from tests.support.rollouts import drive, stage

pytestmark = pytest.mark.django_db(transaction=True)
TTFT_ONLY = {"min_samples": 30, "metrics": [{"metric": "ttft", "stat": "p95", "max_ratio": 1.10}]}
STEPS = [{"set_weight": 50}, {"pause": {"seconds": 30, "min_requests": 30}}]


def served(
    rollout: Rollout, version: str, track: str, ttft_ms: float, count: int, seed: int, after: float = 1
) -> None:
    """``count`` streamed requests as a gateway records them, over 20 s from ``after`` s into the step."""
    rng = random.Random(seed)
    start = rollout.step_started_at
    records = [
        {
            "request_id": f"{track}-{seed}-{n}",
            "tenant": "acme",
            "model_name": "chat",
            "region": "eu-west-1",
            "deployment": rollout.deployment_id,
            "version": f"tiny-llama@{version}",
            "status": 200,
            "completion_tokens": 16,
            "ttft_ms": ttft_ms * rng.lognormvariate(0, 0.25),
            "latency_ms": 400.0,
            "stream": True,
            "track": track,
            "started_at": (start + timedelta(seconds=after + n * 20 / count)).isoformat(),
        }
        for n in range(count)
    ]
    usage_ingest(actor=system(), records=records)


def at_the_judged_pause(world, make_region, tiny_model_dir, steps) -> Rollout:  # type: ignore[no-untyped-def]
    """A canary of 2.0.0 on acme's chat, its weight set, waiting in the judged pause that follows."""
    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="2.0.0", steps=steps, analysis=TTFT_ONLY
    )
    rollout = drive(rollout, {"progressing"})
    while rollout.step == 0:
        drive(rollout, {"progressing"})
    return rollout


def judged(world, make_region, tiny_model_dir, candidate_ms: float, count: int = 200) -> Rollout:  # type: ignore[no-untyped-def]
    rollout = at_the_judged_pause(world, make_region, tiny_model_dir, STEPS)
    served(rollout, "1.0.0", "stable", 100.0, count, seed=1)
    served(rollout, "2.0.0", "candidate", candidate_ms, count, seed=2)
    controller.advance(rollout.pk, now=rollout.step_started_at + timedelta(seconds=31))
    rollout.refresh_from_db()
    return rollout


def test_a_candidate_twenty_percent_slower_is_rolled_back(world, make_region, tiny_model_dir):
    rollout = judged(world, make_region, tiny_model_dir, candidate_ms=120.0)
    assert rollout.state == "failed" and "analysis failed" in rollout.reason
    (run,) = AnalysisRun.objects.filter(rollout=rollout)
    (ttft,) = run.measurements
    assert ttft["test"] == "mann_whitney_u" and ttft["p_value"] < 0.05 and ttft["verdict"] == "failed"
    assert ttft["candidate_samples"] == 200 and ttft["baseline_samples"] == 200
    assert ttft["candidate"] > ttft["baseline"] * 1.1


def test_a_candidate_like_the_baseline_is_promoted(world, make_region, tiny_model_dir):
    rollout = judged(world, make_region, tiny_model_dir, candidate_ms=100.0)
    assert rollout.state == "progressing", rollout.reason
    drive(rollout, {"succeeded"})
    (run,) = AnalysisRun.objects.filter(rollout=rollout)
    assert run.verdict == "successful"
    assert rollout.candidate.status == "production"


def test_too_little_traffic_pauses_for_a_person_who_may_resume(world, make_region, tiny_model_dir):
    s = stage(world, make_region, tiny_model_dir)
    steps = [{"set_weight": 50}, {"pause": {"seconds": 30}}]
    rollout = rollouts.rollout_start(
        actor=s.alice, deployment=s.deployment, version="2.0.0", steps=steps, analysis=TTFT_ONLY
    )
    rollout = drive(rollout, {"progressing"})
    while rollout.step == 0:
        drive(rollout, {"progressing"})
    served(rollout, "2.0.0", "candidate", 100.0, 5, seed=3)
    controller.advance(rollout.pk, now=rollout.step_started_at + timedelta(seconds=31))
    rollout.refresh_from_db()
    assert rollout.state == "paused" and "inconclusive" in rollout.reason
    rollouts.rollout_resume(actor=s.alice, rollout=rollout)
    assert rollout.step == 2  # the inconclusive step counts as passed once a person resumes


def test_the_default_spec_in_a_region_without_prometheus_judges_by_the_gateway(
    world, make_region, tiny_model_dir
):
    s = stage(world, make_region, tiny_model_dir)
    rollout = rollouts.rollout_start(actor=s.alice, deployment=s.deployment, version="2.0.0")
    assert {m["source"] for m in rollout.analysis["metrics"]} == {"gateway"}
    rollout.delete()
    prometheus_spec = {"metrics": [{"metric": "vllm:time_to_first_token_seconds", "max_ratio": 1.2}]}
    with pytest.raises(ValidationFailed, match="has no Prometheus"):
        rollouts.rollout_start(
            actor=s.alice, deployment=s.deployment, version="2.0.0", analysis=prometheus_spec
        )


def test_a_step_whose_baseline_got_too_few_requests_waits_for_it(world, make_region, tiny_model_dir):
    """Plenty of candidate requests and none yet for the baseline (a gateway sent it nothing for a while):
    no verdict on one side's records; judged once the baseline has its share."""
    rollout = at_the_judged_pause(world, make_region, tiny_model_dir, STEPS)
    served(rollout, "2.0.0", "candidate", 100.0, 200, seed=4)
    served(rollout, "1.0.0", "stable", 100.0, 29, seed=5)
    controller.advance(rollout.pk, now=rollout.step_started_at + timedelta(seconds=31))
    rollout.refresh_from_db()
    assert (rollout.state, rollout.step) == ("progressing", 1) and not AnalysisRun.objects.exists()
    served(rollout, "1.0.0", "stable", 100.0, 200, seed=6)
    controller.advance(rollout.pk, now=rollout.step_started_at + timedelta(seconds=40))
    rollout.refresh_from_db()
    assert rollout.step == 2, rollout.reason
    assert AnalysisRun.objects.get(rollout=rollout).verdict == "successful"


def test_a_baseline_short_of_requests_until_the_deadline_is_judged_inconclusive(
    world, make_region, tiny_model_dir
):
    rollout = at_the_judged_pause(world, make_region, tiny_model_dir, STEPS)
    served(rollout, "2.0.0", "candidate", 100.0, 200, seed=7)
    deadline = timedelta(seconds=rollout.progress_deadline_seconds + 1)
    controller.advance(rollout.pk, now=rollout.step_started_at + deadline)
    rollout.refresh_from_db()
    assert rollout.state == "paused" and "inconclusive" in rollout.reason


def test_a_warmup_leaves_the_steps_first_seconds_out_of_the_window(world, make_region, tiny_model_dir):
    """A candidate slow only in the seconds after its weight changed is judged on what came after."""
    steps = [{"set_weight": 50}, {"pause": {"seconds": 40, "min_requests": 30, "warmup_seconds": 20}}]
    rollout = at_the_judged_pause(world, make_region, tiny_model_dir, steps)
    began = rollout.step_started_at
    served(rollout, "2.0.0", "candidate", 900.0, 100, seed=8, after=0)  # 0-20 s: the warm-up, slow
    served(rollout, "1.0.0", "stable", 100.0, 100, seed=9, after=0)
    served(rollout, "2.0.0", "candidate", 100.0, 100, seed=10, after=21)  # 21-41 s: like the baseline
    served(rollout, "1.0.0", "stable", 100.0, 100, seed=11, after=21)
    controller.advance(rollout.pk, now=began + timedelta(seconds=45))
    rollout.refresh_from_db()
    run = AnalysisRun.objects.get(rollout=rollout)
    assert run.verdict == "successful", run.measurements
    assert run.window_start == began + timedelta(seconds=20)
    assert run.measurements[0]["candidate_samples"] == 100
