"""From a failing verdict to 0 % candidate traffic at the gateway.

A real control plane (``manage.py runserver`` on a throw-away SQLite database), a real gateway process
(``python -m gateway``, long-polling it) and simulator engines in one local process region. Each trial
starts a canary at 50 %, waits until the gateway serves the candidate, then calls the rollback the
controller calls on a failed analysis, and measures, from that call:

- the control plane's part: until the rollback's route-table generation is written (``rollback`` returns);
- the gateway's part: until the gateway holds that generation (its /healthz), from then on 0 % candidate;
- the last answer a client got from the candidate (a request already in flight may still finish there).

    .venv/bin/python bench/rollout_rollback_bench.py [--trials 5]
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
VAR = tempfile.mkdtemp(prefix="cp-rollback-bench-")
os.environ["CONTROLPLANE_VAR_DIR"] = VAR
os.environ.pop("DATABASE_URL", None)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("LOG_LEVEL", "ERROR")

import django  # noqa: E402

django.setup()

import requests  # noqa: E402
from django.core.management import call_command  # noqa: E402

from core.choices import PlatformRole, Scope, TenantRole  # noqa: E402
from core.services.tenants import service_account_create  # noqa: E402
from core.services.tokens import token_create  # noqa: E402
from regions.drivers.factory import driver_for  # noqa: E402
from regions.models import DeploymentTarget  # noqa: E402
from regions.reconciler import reconcile_target  # noqa: E402
from regions.services.deployments import deployment_create  # noqa: E402
from regions.services.regions import region_create  # noqa: E402
from regions.workloads import target_workload  # noqa: E402
from rollouts import controller  # noqa: E402
from rollouts.services import machine, rollouts  # noqa: E402
from routing import services as routing  # noqa: E402
from tests.support.factories import MembershipFactory, TenantFactory, UserFactory  # noqa: E402
from tests.support.principals import principal  # noqa: E402
from tests.support.processes import free_port, wait_for  # noqa: E402
from tests.support.regions import tiny_version  # noqa: E402
from tests.support.rollouts import next_version  # noqa: E402


def converge(deployment) -> None:  # type: ignore[no-untyped-def]
    for target in DeploymentTarget.objects.filter(deployment=deployment).exclude(status="deleted"):
        DeploymentTarget.objects.filter(pk=target.pk).update(lease_until=None)
        reconcile_target(target.pk)


def start(command: list[str], **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    operator = UserFactory(username="ops", platform_role=PlatformRole.OPERATOR)
    admin = UserFactory(username="root", platform_role=PlatformRole.ADMIN)
    tenant = TenantFactory(slug="acme", residency=["EU"])
    alice = principal(MembershipFactory(tenant=tenant, role=TenantRole.ADMIN, user__username="alice").user)
    region_create(
        actor=principal(operator),
        code="eu-west-1",
        name="EU",
        provider="local",
        jurisdiction="EU",
        driver="process",
        driver_config={"state_dir": f"{VAR}/engines", "engine": "simulator"},
        gpu_pools=[{"gpu_type": "L4", "memory_gib": 24, "gpu_count": 8}],
    )
    model_dir = Path(VAR) / "models" / "tiny"  # under var/models: the one artifact source allowed by default
    model_dir.mkdir(parents=True)
    baseline = tiny_version(alice, model_dir, owner=tenant)
    deployment = deployment_create(
        actor=alice, owner=tenant, name="chat", model=baseline.model, version="1.0.0", regions=["eu-west-1"]
    )
    wait_for(
        lambda: converge(deployment) or DeploymentTarget.objects.get(deployment=deployment).status == "ready"
    )
    robot = service_account_create(actor=principal(admin), name="gateway", role=PlatformRole.ADMIN)
    gateway_token = token_create(
        actor=principal(admin), name="gw", scopes=[Scope.GATEWAY_SYNC], service_account=robot
    )[1]
    app_token = token_create(actor=alice, name="app", scopes=[Scope.MODELS_INVOKE])[1]
    routing.publish()
    cp_port, gw_port = free_port(), free_port()
    procs = [start([sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{cp_port}"])]
    wait_for(lambda: _answers(f"http://127.0.0.1:{cp_port}/healthz"), timeout=60)
    procs.append(
        start(
            [sys.executable, "-m", "gateway", "--port", str(gw_port)],
            CONTROL_PLANE_URL=f"http://127.0.0.1:{cp_port}",
            GATEWAY_TOKEN=gateway_token,
            GATEWAY_STATE_DIR=f"{VAR}/gateway",
        )
    )
    gateway = f"http://127.0.0.1:{gw_port}"
    wait_for(lambda: _generation(gateway) > 0, timeout=60)
    results = []
    try:
        for trial in range(args.trials):
            candidate = next_version(alice, baseline, f"2.0.{trial}")
            results.append(run_trial(alice, deployment, candidate.version, gateway, app_token))
            print(
                f"trial {trial + 1}: rollback written {results[-1][0]:.1f} ms, gateway at 0 % "
                f"{results[-1][1]:.1f} ms, last candidate answer {results[-1][2]:.1f} ms after the verdict"
            )
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for target in DeploymentTarget.objects.select_related("deployment", "region"):
            driver_for(target.region).delete(target_workload(target))  # no engine outlives the bench
    for label, index in (("rollback written", 0), ("gateway serving 0 % candidate", 1)):
        values = [r[index] for r in results]
        print(f"{label}: median {statistics.median(values):.1f} ms, max {max(values):.1f} ms")


def run_trial(alice, deployment, version: str, gateway: str, token: str) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    rollout = rollouts.rollout_start(
        actor=alice, deployment=deployment, version=version, steps=[{"set_weight": 50}, {"pause": {}}]
    )

    def paused() -> bool:
        converge(deployment)
        controller.advance(rollout.pk)
        rollout.refresh_from_db()
        return rollout.state == "paused"

    wait_for(paused, timeout=60)
    generation = routing.publish().generation
    wait_for(lambda: _generation(gateway) >= generation, timeout=30)
    answers: list[tuple[float, str]] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            reply = requests.post(
                f"{gateway}/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                headers={"Authorization": f"Bearer {token}", "x-session-id": uuid.uuid4().hex},
                timeout=30,
            )
            answers.append((time.perf_counter(), reply.headers.get("x-model-version", "")))

    caller = threading.Thread(target=client)
    caller.start()
    wait_for(lambda: any(v.endswith(version) for _, v in answers), timeout=30, interval=0.01)
    verdict = time.perf_counter()
    machine.rollback(rollout, "failed", "bench: a failing verdict")
    written = time.perf_counter()
    target = routing.selectors.current().generation
    wait_for(lambda: _generation(gateway) >= target, timeout=30, interval=0.005)
    at_gateway = time.perf_counter()
    time.sleep(1)
    stop.set()
    caller.join()
    last = max((t for t, v in answers if v.endswith(version)), default=verdict)
    converge(deployment)
    return (written - verdict) * 1e3, (at_gateway - verdict) * 1e3, (last - verdict) * 1e3


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code < 500
    except requests.RequestException:
        return False


def _generation(gateway: str) -> int:
    try:
        return int(requests.get(f"{gateway}/healthz", timeout=1).json()["generation"])
    except (requests.RequestException, ValueError, KeyError):
        return 0


if __name__ == "__main__":
    main()
