"""The curl CI example (docs/ci/registry-ci.sh), run end to end against a running server."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.services.tenants import service_account_create
from core.services.tokens import token_create
from registry.models import ModelVersion, RegisteredModel
from tests.support.factories import TenantFactory
from tests.support.principals import principal
from tests.support.processes import child_env
from tests.support.registry import GOOD_METRICS, version_payload

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


def test_a_rerun_prints_the_versions_real_status(run_ci):
    """A second run used to print "status: draft" (the replayed registration) for a canary version."""
    first = run_ci(version_payload("5.0.0"), GOOD_METRICS)
    assert first.returncode == 0, first.stdout + first.stderr
    again = run_ci(version_payload("5.0.0"), GOOD_METRICS)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "  status: canary" in again.stdout and "status: draft" not in again.stdout
    assert "acme/llama-3-8b@5.0.0 is canary" in again.stdout
    assert ModelVersion.objects.get(version="5.0.0").transitions.count() == 4


REPO = SCRIPT.parents[2]
DOCS = REPO / "docs" / "registry.md"


def documented_sequence() -> str:
    """The shell block of docs/registry.md's CI section, exactly as a reader copies it."""
    section = DOCS.read_text().split("\n## CI\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found, "docs/registry.md's CI section has no sh block"
    return found.group(1)


def test_the_documented_sequence_works_against_the_demo_tenant(db, live_server):
    """Followed literally, the docs used to fail with "No model 'acme-eu/llama-3-8b'"."""
    TenantFactory(slug="acme-eu", residency=["EU", "CH"])  # the demo tenant, as seed_demo creates it
    block = documented_sequence()
    assert "acme-eu/" in block and "docs/ci/" in block
    # Only the machine-specific bits change: the demo's URL becomes the test server's, and the venv's
    # interpreter this one.
    script = block.replace("http://127.0.0.1:8000", live_server.url).replace(
        ".venv/bin/python", sys.executable
    )

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(),
        )

    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    assert "acme-eu/llama-3-8b@1.0.0 is canary" in first.stdout
    model = RegisteredModel.objects.get(owner__slug="acme-eu", name="llama-3-8b")
    assert (
        model.validation_policy == json.loads((REPO / "docs/ci/model.json").read_text())["validation_policy"]
    )
    version = model.versions.get(version=json.loads((REPO / "docs/ci/version.json").read_text())["version"])
    assert version.status == "canary" and version.reports.get().outcome == "passed"

    again = run()  # safe to re-run: the model exists, the version is canary, and the script says so
    assert again.returncode == 0, again.stdout + again.stderr
    assert "  status: canary" in again.stdout and "status: draft" not in again.stdout
    assert version.transitions.count() == 4
