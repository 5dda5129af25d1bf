"""The rollout CI example (docs/ci/rollout-ci.sh) against a running server: register, validate, start a
rollout, wait for it, print the verdicts; exit 0 only when the rollout succeeded.

No Celery worker runs here: the test thread plays the worker (the reconciler's passes and the rollout
controller) while the script polls the live server, as the worker would in production."""

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from core.services.tenants import service_account_create
from core.services.tokens import token_create
from registry.models import ModelVersion
from rollouts import controller, plan
from rollouts.api.serializers import RolloutWriteSerializer
from rollouts.choices import ACTIVE_STATES
from rollouts.models import AnalysisRun, Rollout
from tests.support.principals import principal
from tests.support.regions import TINY_ENGINE_ARGS, converge
from tests.support.registry import GOOD_METRICS, version_payload
from tests.support.rollouts import Stage, stage

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "ci" / "rollout-ci.sh"
SCOPES = ["registry:read", "registry:write", "registry:promote", "deployments:read", "deployments:write"]


def tiny_payload(s: Stage, version: str) -> dict:
    """A new release of acme's tiny-llama as CI would post it: the same tiny weights, a new version."""
    base = s.baseline
    return version_payload(
        version,
        hashlib.sha256(version.encode()).hexdigest(),
        artifact_uri=base.artifact_uri,
        served_model_name=base.served_model_name,
        parameter_count=base.parameter_count,
        dtype=base.dtype,
        max_context_length=base.max_context_length,
        engine_args=TINY_ENGINE_ARGS,
        architecture=base.architecture,
        allowed_jurisdictions=base.allowed_jurisdictions,
        artifact_manifest=[],
    )


@pytest.fixture
def ci(world, make_region, tiny_model_dir, live_server, tmp_path):  # type: ignore[no-untyped-def]
    """(stage, run): run(rollout, version=…, on_pass=…, **env) runs the script while the test thread
    reconciles and advances the deployment's rollouts; on_pass(rollout, printed) is called after each
    pass with what the script has printed so far."""
    s = stage(world, make_region, tiny_model_dir)
    alice = principal(world.alice)
    robot = service_account_create(actor=alice, tenant=world.tenant_a, name="release", role="developer")
    _, secret = token_create(actor=alice, name="ci", service_account=robot, scopes=SCOPES)

    def run(
        rollout: dict,
        version: str = "3.0.0",
        on_pass: Callable[[Rollout, str], None] | None = None,
        drive: bool = True,
        **env: str,
    ) -> subprocess.CompletedProcess[str]:
        (tmp_path / "version.json").write_text(json.dumps(tiny_payload(s, version)))
        (tmp_path / "report.json").write_text(json.dumps(GOOD_METRICS))
        (tmp_path / "rollout.json").write_text(json.dumps(rollout))
        out, err = (tmp_path / "stdout").open("w+"), (tmp_path / "stderr").open("w+")
        proc = subprocess.Popen(
            ["bash", str(SCRIPT)],
            stdout=out,
            stderr=err,
            text=True,
            env={
                **os.environ,
                "CONTROLPLANE_URL": live_server.url,
                "CONTROLPLANE_TOKEN": secret,
                "MODEL": "acme/tiny-llama",
                "DEPLOYMENT": "acme/chat",
                "VERSION_FILE": str(tmp_path / "version.json"),
                "REPORT_FILE": str(tmp_path / "report.json"),
                "ROLLOUT_FILE": str(tmp_path / "rollout.json"),
                "POLL_SECONDS": "0.3",
                "ROLLOUT_TIMEOUT": "90",
                **env,
            },
        )
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            for found in Rollout.objects.filter(deployment=s.deployment, state__in=ACTIVE_STATES):
                if drive:
                    converge(s.deployment)
                    controller.advance(found.pk)
                    found.refresh_from_db()
                if on_pass:
                    on_pass(found, (tmp_path / "stdout").read_text())
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        out.close(), err.close()
        printed = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
        return subprocess.CompletedProcess(proc.args, proc.returncode, *printed)

    return s, run


def test_a_rollout_that_succeeds_passes_the_pipeline(ci):
    s, run = ci
    result = run({"strategy": "canary", "steps": [{"set_weight": 50}], "analysis": {}})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "registering acme/tiny-llama@3.0.0" in out and "validation: passed" in out
    assert "starting a rollout of acme/tiny-llama@3.0.0 onto acme/chat" in out
    rollout = Rollout.objects.get()
    assert f"/rollouts/{rollout.pk}/" in out
    assert "succeeded: wave 1/1 its steps done; candidate eu-west-1 100 %" in out
    assert f"rollout {rollout.pk} of acme/chat (canary of 3.0.0 over 1.0.0): succeeded" in out
    assert "analysis runs: none" in out and "succeeded: every wave's plan is done, no step was judged" in out
    assert out.rstrip().endswith("acme/tiny-llama@3.0.0 rolled out onto acme/chat")
    version = ModelVersion.objects.get(version="3.0.0")
    s.deployment.refresh_from_db()
    assert rollout.state == "succeeded"
    # The deployment runs it; with no judged step the rollout is no evidence for production: still canary.
    assert version.status == "canary" and s.deployment.version == version

    again = run({"strategy": "canary", "steps": [{"set_weight": 50}], "analysis": {}})  # a re-run of the job
    assert again.returncode == 0, again.stdout + again.stderr
    assert Rollout.objects.count() == 1 and f"rollout {rollout.pk} of acme/chat" in again.stdout


def test_an_aborted_rollout_fails_the_pipeline_with_the_reason_and_the_verdicts(ci, api, world):
    s, run = ci
    client = api(world.alice)

    def abort_when_paused(rollout: Rollout, printed: str) -> None:
        """Once the script has seen the pause: the analysis run a judged step would leave, then abort."""
        if "  paused: " not in printed or rollout.analysis_runs.exists():
            return
        AnalysisRun.objects.create(  # what the controller stores after judging a step
            rollout=rollout,
            wave=0,
            step=1,
            region="eu-west-1",
            window_start=rollout.created_at,
            window_end=rollout.created_at,
            verdict="failed",
            measurements=[
                {
                    "metric": "ttft",
                    "stat": "p95",
                    "candidate": 912.0,
                    "baseline": 455.5,
                    "candidate_samples": 200,
                    "baseline_samples": 812,
                    "test": "mann_whitney_u",
                    "statistic": 30123.0,
                    "p_value": 0.00012,
                    "threshold": "≤ baseline × 1.10",
                    "verdict": "failed",
                    "reason": "912 > 501",
                }
            ],
            message="ttft p95: failed",
        )
        reason = {"reason": "TTFT regression seen by the SRE"}
        answer = client.post(f"/api/v1/rollouts/{rollout.pk}/abort/", reason, format="json")
        assert answer.status_code == 200, answer.content

    result = run(
        {"steps": [{"set_weight": 10}, {"pause": {}}], "on_failure": "rejected"}, on_pass=abort_when_paused
    )
    assert result.returncode == 1, result.stdout + result.stderr
    rollout = Rollout.objects.get()
    assert rollout.state == "aborted"
    out = result.stdout
    assert "paused: wave 1/1 step 2/2; candidate eu-west-1 10 %" in out
    assert f"rollout {rollout.pk} of acme/chat (canary of 3.0.0 over 1.0.0): aborted" in out
    assert "  reason: aborted by alice: TTFT regression seen by the SRE" in out
    assert "  wave 1 step 2 in eu-west-1: failed (ttft p95: failed)" in out
    assert (
        "    ttft p95: candidate 912 (n=200) vs baseline 455.5 (n=812); mann_whitney_u statistic 3.012e+04"
        " p 0.00012; threshold ≤ baseline × 1.10: failed (912 > 501)"
    ) in out
    assert f"rollout {rollout.pk} aborted: aborted by alice: TTFT regression seen by the SRE" in result.stderr
    assert ModelVersion.objects.get(version="3.0.0").status == "rejected"  # on_failure
    s.deployment.refresh_from_db()
    assert s.deployment.version == s.baseline


def test_refusals_and_timeouts_fail_the_pipeline(ci):
    _, run = ci
    bad = run({"steps": [{"set_weight": 50}, {"set_weight": 10}]}, version="2.0.0", SKIP_REGISTER="1")
    assert bad.returncode == 1
    assert "weights must grow" in bad.stderr and "step start failed" in bad.stderr
    assert not Rollout.objects.exists()

    # Nobody advances the rollout: the wait times out, and ABORT_ON_TIMEOUT takes it back.
    slow = run(
        {"steps": [{"set_weight": 10}]},
        version="2.0.0",
        drive=False,
        SKIP_REGISTER="1",
        ROLLOUT_TIMEOUT="1",
        ABORT_ON_TIMEOUT="1",
    )
    assert slow.returncode == 3, slow.stdout + slow.stderr
    rollout = Rollout.objects.get()
    assert "is still pending after 1 s" in slow.stderr
    assert rollout.state == "aborted" and "CI gave up waiting after 1 s" in rollout.reason
    assert "registering" not in slow.stdout  # SKIP_REGISTER


def test_the_shipped_rollout_body_is_a_valid_plan():
    """docs/ci/rollout.json, the example ROLLOUT_FILE: only fields the API takes, and a plan it accepts."""
    body = json.loads((SCRIPT.parent / "rollout.json").read_text())
    assert set(body) <= set(RolloutWriteSerializer().fields) - {"deployment", "version"}
    assert plan.parse_steps(body["steps"], body["strategy"]) == body["steps"]
