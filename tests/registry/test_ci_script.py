"""The curl CI example (docs/ci/registry-ci.sh), run end to end against a running server."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from controlplane.services.tenants import service_account_create
from controlplane.services.tokens import token_create
from registry.models import ModelVersion
from tests.conftest import principal
from tests.registry.conftest import GOOD_METRICS, version_payload

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "ci" / "registry-ci.sh"


@pytest.fixture
def run_ci(world, chat_model, live_server, tmp_path):
    robot = service_account_create(
        actor=principal(world.alice), tenant=world.tenant_a, name="release", role="admin"
    )
    _, secret = token_create(
        actor=principal(world.alice),
        name="ci",
        service_account=robot,
        scopes=["registry:read", "registry:write", "registry:promote"],
    )

    def run(version: dict, report: dict, **env: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / "version.json").write_text(json.dumps(version))
        (tmp_path / "report.json").write_text(json.dumps(report))
        return subprocess.run(
            ["bash", str(SCRIPT)],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                **os.environ,
                "CONTROLPLANE_URL": live_server.url,
                "CONTROLPLANE_TOKEN": secret,
                "MODEL": "acme/llama-3-8b",
                "VERSION_FILE": str(tmp_path / "version.json"),
                "REPORT_FILE": str(tmp_path / "report.json"),
                **env,
            },
        )

    return run


def test_script_registers_validates_and_promotes_to_production(run_ci):
    env = {"PROMOTE_TO": "production", "OVERRIDE_REASON": "canary SLOs green for 24h"}
    result = run_ci(version_payload(), GOOD_METRICS, **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "acme/llama-3-8b@1.0.0 is production" in result.stdout
    version = ModelVersion.objects.get(version="1.0.0")
    assert version.status == "production"
    assert [t.to_status for t in version.transitions.all()] == [
        "validating",
        "validated",
        "staged",
        "canary",
        "production",
    ]
    again = run_ci(version_payload(), GOOD_METRICS, **env)  # a re-run of the pipeline changes nothing
    assert again.returncode == 0, again.stdout + again.stderr
    assert version.transitions.count() == 5 and version.reports.count() == 1


def test_script_stops_at_canary_by_default(run_ci):
    result = run_ci(version_payload("2.0.0"), GOOD_METRICS)
    assert result.returncode == 0, result.stderr
    assert ModelVersion.objects.get(version="2.0.0").status == "canary"


def test_failed_validation_rejects_the_version_and_fails_the_pipeline(run_ci):
    result = run_ci(
        version_payload("3.0.0"), {"metrics": {"mmlu": 0.2}, "performance": {"ttft_p95_ms": 100.0}}
    )
    assert result.returncode == 1 and "rejected" in result.stderr
    assert ModelVersion.objects.get(version="3.0.0").status == "rejected"


def test_bad_input_fails_with_the_error_envelope(run_ci):
    result = run_ci(version_payload("4.0.0", artifact_sha256="not-a-digest"), GOOD_METRICS)
    assert result.returncode == 1
    assert '"code":"invalid"' in result.stderr.replace(" ", "") and "artifact_sha256" in result.stderr
    assert not ModelVersion.objects.filter(version="4.0.0").exists()
