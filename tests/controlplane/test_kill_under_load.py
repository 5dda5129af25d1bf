"""Every process of the control plane killed in turn under steady gateway load, with two of each where a
standby takes over: the router and the beat (SIGKILL; the standby takes the lease), the Celery worker
(SIGKILL while a change waits to be reconciled; a new one converges it), the web (SIGKILL; the gateways
serve from their table until it is back) and a gateway (taken out of the load balancer's rotation, as
its preStop hook does on Kubernetes, then SIGTERM: it finishes what it carries). Six clients keep streamed
chats in flight throughout: none fails, and afterwards the fleet is converged on the change made while
the worker was dead."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from django.conf import settings

from core.choices import Scope
from core.services.leases import lease_holder
from core.services.tokens import token_create
from regions.models import DeploymentTarget
from regions.services.deployments import deployment_create, deployment_scale
from routing import services as routing
from tests.support.forwarder import Forwarder
from tests.support.gateway import Gateway, gateway_secret
from tests.support.load import Clients
from tests.support.principals import principal
from tests.support.processes import child_env, free_port, stop_all, wait_for
from tests.support.regions import tiny_version, until_ready

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
LOAD_SECONDS = 4  # of steady load after each kill, before the next


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    # A session of its own, so a kill takes the process with its children, as a pod's death does.
    return subprocess.Popen(
        [sys.executable, *command],
        env=env,
        stdout=log.open("a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _holder_pid(lease: str) -> int:
    holder = lease_holder(lease)
    return int(holder.split(":")[1]) if holder else 0


def _answers(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def test_killing_each_process_in_turn_fails_no_request_and_the_fleet_converges(
    world, make_region, tiny_model_dir, tmp_path
):
    make_region("eu-west-1", "EU")
    alice = principal(world.alice)
    version = tiny_version(principal(world.operator), tiny_model_dir)
    chat = deployment_create(
        actor=alice, owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )
    until_ready(chat)
    _, token = token_create(actor=alice, name="app", scopes=[Scope.MODELS_INVOKE])
    routing.publish()
    # The processes' own broker: their periodic tasks reach their worker, never another test's.
    env = child_env(
        CELERY_BROKER_URL="filesystem://localhost//",
        CONTROLPLANE_VAR_DIR=str(tmp_path / "var"),
        RECONCILE_INTERVAL_SECONDS="1",
        SECRET_KEY=settings.SECRET_KEY,  # as every process of one installation shares it: the engines' keys
    )
    web_port = free_port()
    web_url = f"http://127.0.0.1:{web_port}"
    web_command = ["-m", "gunicorn", "controlplane.wsgi", "--bind", f"127.0.0.1:{web_port}", "--threads", "8"]
    web_command += ["--control-socket", str(tmp_path / "gunicorn.ctl")]
    worker_command = ["-m", "celery", "-A", "controlplane", "worker", "--pool", "solo", "--without-gossip"]
    beat = ["-m", "celery", "-A", "controlplane", "beat", "-s"]
    procs = {
        "web": _start(web_command, tmp_path / "web.log", env),
        "worker": _start(worker_command, tmp_path / "worker.log", env),
        "routers": [
            _start(["-m", "django", "route", "--interval", "0.5"], tmp_path / f"router-{n}.log", env)
            for n in (1, 2)
        ],
        "beats": [
            _start([*beat, str(tmp_path / f"schedule-{n}")], tmp_path / f"beat-{n}.log", env) for n in (1, 2)
        ],
    }
    gateways: list[Gateway] = []
    try:
        wait_for(lambda: _answers(web_url), timeout=60)
        secret = gateway_secret(world)
        gateways = [
            Gateway(web_url, secret, tmp_path / f"routes-{n}.json", tmp_path / f"gw-{n}.log") for n in (1, 2)
        ]
        front = Forwarder(*(g.port for g in gateways))
        wait_for(lambda: lease_holder("router") and lease_holder("beat"), timeout=60)
        with Clients(front, token) as clients:  # type: ignore[arg-type]
            time.sleep(LOAD_SECONDS)

            router = _holder_pid("router")
            os.kill(router, signal.SIGKILL)
            wait_for(lambda: _holder_pid("router") not in (0, router), timeout=30)
            time.sleep(LOAD_SECONDS)

            beat_pid = _holder_pid("beat")
            os.kill(beat_pid, signal.SIGKILL)
            wait_for(lambda: _holder_pid("beat") not in (0, beat_pid), timeout=40)
            time.sleep(LOAD_SECONDS)

            _kill(procs["worker"])  # a change made while no worker runs waits for the next one
            deployment_scale(actor=alice, deployment=chat, replicas=2)
            time.sleep(LOAD_SECONDS)
            procs["worker"] = _start(worker_command, tmp_path / "worker.log", env)

            _kill(procs["web"])
            time.sleep(LOAD_SECONDS)  # the gateways serve from their table meanwhile
            procs["web"] = _start(web_command, tmp_path / "web.log", env)
            wait_for(lambda: _answers(web_url), timeout=60)

            front.leave(gateways[0].port)  # out of rotation first, as a preStop hook does
            time.sleep(1)
            gateways[0].stop()  # SIGTERM: it finishes what it carries, then exits
            time.sleep(LOAD_SECONDS)

            target = wait_for(
                lambda: DeploymentTarget.objects.filter(
                    deployment=chat, status="ready", ready_replicas=2
                ).first(),
                timeout=90,
            )
        assert clients.failed() == [], clients.failed()[:5]
        assert len(clients.answers) > 50
        assert len(target.endpoints) == 2
        table = routing.publish()
        assert len(table.body["tenants"]["acme"]["models"]["chat"]["endpoints"]) == 2
    finally:
        for gateway in gateways:
            if gateway.proc.poll() is None:
                gateway.stop()
        stop_all([procs["web"], procs["worker"], *procs["routers"], *procs["beats"]])
