"""The deployable package: the Kubernetes manifests validate against Kubernetes' own schemas and hold
what a production install needs (two of everything, disruption budgets, probes, secrets by reference, no
root), and the image's entry point runs each process of the platform. The image itself is not built
here (no base image can be pulled on CI's machines); tests/controlplane/test_packaging.py installs the
wheel it is built from and runs the entry point's commands from it."""

import os
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "controlplane.yaml").read_text()))
ROLES = {"web", "worker", "scheduler", "router", "gateway", "migrate", "manage"}
SECRET_NAMES = {
    "SECRET_KEY",
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "REDIS_URL",
    "GATEWAY_TOKEN",
    "GATEWAY_REDIS_URL",
}


def _of(kind: str) -> list[dict]:  # type: ignore[type-arg]
    return [m for m in MANIFESTS if m["kind"] == kind]


def _pods() -> list[dict]:  # type: ignore[type-arg]
    return [m["spec"]["template"] for m in MANIFESTS if m["kind"] in ("Deployment", "Job")]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda m: f"{m['kind']}/{m['metadata']['name']}")
def test_every_manifest_validates_against_the_kubernetes_schema(manifest):
    kubernetes_validate.validate(manifest, kubernetes_validate.utils.latest_version(), strict=True)


def test_every_process_runs_twice_behind_a_disruption_budget():
    budgets = {
        tuple(sorted(b["spec"]["selector"]["matchLabels"].items())) for b in _of("PodDisruptionBudget")
    }
    roles = set()
    for deployment in _of("Deployment"):
        assert deployment["spec"]["replicas"] >= 2, deployment["metadata"]["name"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert tuple(sorted(deployment["spec"]["selector"]["matchLabels"].items())) in budgets
        roles.add(deployment["spec"]["template"]["spec"]["containers"][0]["args"][0])
    assert roles == {"web", "worker", "scheduler", "router", "gateway"}
    (job,) = _of("Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]


def test_pods_run_the_one_image_without_root_and_take_secrets_by_reference_only():
    assert not _of("Secret")  # the operator creates it; nothing here holds a secret
    images = set()
    for pod in _pods():
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["serviceAccountName"] == "controlplane"  # which mounts no API token
        for container in spec["containers"]:
            images.add(container["image"])
            assert container["args"][0] in ROLES
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert "memory" in container["resources"]["limits"]
            for variable in container.get("env", []):
                if variable["name"] in SECRET_NAMES or "TOKEN" in variable["name"]:
                    assert "secretKeyRef" in variable.get("valueFrom", {}), variable
    assert len(images) == 1
    (account,) = _of("ServiceAccount")
    assert account["automountServiceAccountToken"] is False


def test_web_and_gateway_are_probed_and_drained():
    for name, ready in (("controlplane-web", "/readyz"), ("llm-gateway", "/readyz")):
        (deployment,) = [d for d in _of("Deployment") if d["metadata"]["name"] == name]
        spec = deployment["spec"]["template"]["spec"]
        container = spec["containers"][0]
        ports = {p["name"] for p in container["ports"]}
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == ready
        assert container["readinessProbe"]["httpGet"]["port"] in ports
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (gateway,) = [d for d in _of("Deployment") if d["metadata"]["name"] == "llm-gateway"]
    spec = gateway["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    # preStop (the Service stops sending) + the gateway's own grace fit in the pod's grace period.
    assert 5 + int(env["GATEWAY_SHUTDOWN_GRACE_SECONDS"]) < spec["terminationGracePeriodSeconds"]


@pytest.mark.parametrize(
    ("role", "command"),
    [
        (
            "web",
            "gunicorn controlplane.wsgi --bind 0.0.0.0:8000 --workers 4 "
            "--access-logfile - --graceful-timeout 30",
        ),
        ("worker", "celery -A controlplane worker --loglevel INFO --hostname worker@%h --concurrency 4"),
        ("scheduler", "celery -A controlplane beat --loglevel INFO --schedule /tmp/celerybeat-schedule"),
        ("router", "django-admin route"),
        ("gateway", "python -m gateway --host 0.0.0.0 --port 8080 --workers 1"),
        ("migrate", "django-admin migrate --noinput"),
    ],
)
def test_the_entry_point_runs_each_process_of_the_platform(role, command):
    extra = ["--concurrency", "4"] if role == "worker" else []
    env = {k: v for k, v in os.environ.items() if k not in {"PORT", "WEB_WORKERS", "GATEWAY_WORKERS"}}
    done = subprocess.run(
        ["sh", str(DEPLOY / "entrypoint.sh"), role, *extra],
        env={**env, "ENTRYPOINT_PRINT": "1", "BEAT_SCHEDULE_FILE": "/tmp/celerybeat-schedule"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == command


def test_the_entry_point_refuses_an_unknown_role():
    done = subprocess.run(["sh", str(DEPLOY / "entrypoint.sh"), "shell"], capture_output=True, text=True)
    assert done.returncode == 64 and "usage:" in done.stderr


def test_the_image_runs_the_entry_point_as_a_user_without_privileges():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "USER 10001" in dockerfile and 'ENTRYPOINT ["controlplane-entrypoint"]' in dockerfile
    assert "COPY deploy/entrypoint.sh /usr/local/bin/controlplane-entrypoint" in dockerfile
    assert "--constraint constraints.txt" in dockerfile  # the versions CI tested
