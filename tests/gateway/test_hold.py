"""Scale-from-zero end to end: a gateway process holds requests for a deployment the autoscaler idled to
zero, has the live control plane wake it, and releases them once the reconciler has started the engine
(the simulator) and the router has published it; the queue's cap, timeout and disconnects, and a control
plane that goes away while requests are held."""

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import requests

from autoscaling.models import ScalingDecision
from billing.models import UsageRecord
from core.models import AuditEvent
from regions.models import Deployment, DeploymentTarget
from regions.services.deployments import deployment_create
from routing import health
from tests.support.forwarder import Forwarder
from tests.support.gateway import Gateway, chat
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.regions import converge, until_ready
from tests.support.scale_from_zero import idle_to_zero

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def idle_deployment(world, fleet) -> Deployment:  # type: ignore[no-untyped-def]
    """acme's `idle` in eu-west-1 (its home), at zero because idle, and the table saying so."""
    version = fleet["deployment"].version
    idle = deployment_create(
        actor=principal(world.alice),
        owner=world.tenant_a,
        name="idle",
        model=version.model,
        version=version.version,
        regions=["eu-west-1"],
    )
    idle_to_zero(idle, "eu-west-1")
    converge(idle)  # paused: no engine
    route = publish(fleet["gateway"])["tenants"]["acme"]["models"]["idle"]
    assert route["activatable"] == {"deployment": idle.pk, "region": "eu-west-1"}
    return idle


def publish(*gateways: Gateway) -> dict:  # type: ignore[type-arg]
    """One round of the routing loop, and the gateways holding its table."""
    table = health.cycle()
    for gateway in gateways:
        wait_for(lambda g=gateway: g.generation() >= table.generation, timeout=10)
    return table.body  # type: ignore[no-any-return]


def desired(deployment: Deployment) -> int:
    return DeploymentTarget.objects.get(deployment=deployment).desired_replicas


def holding(gateway: Gateway, count: int) -> bool:
    return bool(gateway.health()["holds"]["held_now"] == count)


def test_a_request_at_zero_is_held_wakes_its_region_and_is_answered(world, fleet):
    gateway, alice = fleet["gateway"], fleet["tokens"]["alice"]
    idle = idle_deployment(world, fleet)
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(chat, gateway, alice, "idle")
        wait_for(lambda: desired(idle) == 1, timeout=15)  # the gateway asked; the control plane woke it
        assert holding(gateway, 1) and not held.done()
        until_ready(idle)  # the reconciler starts the engine
        publish()  # the router publishes it; the gateway's long-poll brings the table
        reply = held.result(timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-served-region"] == "eu-west-1" and int(reply.headers["x-held-ms"]) > 0
    holds = gateway.health()["holds"]
    assert holds["held_now"] == 0 and holds["held"] == holds["released"] == 1
    assert holds["activations"] >= 1 and holds["activation_errors"] == 0
    # Woken once, however often the gateway asked while it started: one audit entry, one decision.
    (decision,) = ScalingDecision.objects.filter(deployment=idle, kind="activate")
    assert (decision.from_replicas, decision.to_replicas) == (0, 1)
    assert decision.reason == "1 request(s) held at a gateway"
    assert AuditEvent.objects.filter(action="deployment.autoscaled", actor_name="gateway").count() == 1
    record = wait_for(lambda: UsageRecord.objects.filter(request_id=reply.headers["x-request-id"]).first())
    assert record.status == 200 and record.deployment == idle
    assert record.latency_ms >= int(reply.headers["x-held-ms"])  # the client's whole wait
    metrics = requests.get(f"{gateway.url}/metrics", timeout=2).text
    assert "gateway_hold_released_total 1" in metrics and "gateway_hold_held_now 0" in metrics
    assert chat(gateway, alice, "idle").headers.get("x-held-ms") is None  # awake now: not held


def test_over_the_cap_a_request_is_refused_at_once_with_retry_after(world, fleet, tmp_path):
    idle = idle_deployment(world, fleet)
    gateway = Gateway(
        fleet["live"].url,
        fleet["gateway_token"],
        tmp_path / "capped.json",
        tmp_path / "capped.log",
        GATEWAY_HOLD_MAX_REQUESTS="2",
        GATEWAY_HOLD_TIMEOUT_SECONDS="5",
    )
    alice = fleet["tokens"]["alice"]
    try:
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(chat, gateway, alice, "idle") for _ in range(2)]
            wait_for(lambda: holding(gateway, 2), timeout=10)
            refused = chat(gateway, alice, "idle")
            assert refused.status_code == 503 and refused.headers["retry-after"] == "10"
            assert refused.json()["error"]["code"] == "activation_queue_full"
            # Nobody starts the engine: the two held ones time out in their turn.
            assert [r.result(timeout=15).status_code for r in held] == [504, 504]
        holds = gateway.health()["holds"]
        assert (holds["held"], holds["rejected_full"], holds["timed_out"], holds["held_now"]) == (2, 1, 2, 0)
        assert desired(idle) == 1  # the two held ones did wake it
    finally:
        gateway.stop()


def test_a_request_still_held_at_the_timeout_is_504_and_never_metered(world, fleet, tmp_path):
    idle = idle_deployment(world, fleet)
    gateway = Gateway(
        fleet["live"].url,
        fleet["gateway_token"],
        tmp_path / "t.json",
        tmp_path / "t.log",
        GATEWAY_HOLD_TIMEOUT_SECONDS="2",
    )
    try:
        started = time.monotonic()
        reply = chat(gateway, fleet["tokens"]["alice"], "idle")
        assert reply.status_code == 504 and reply.json()["error"]["code"] == "activation_timeout"
        assert 2 <= time.monotonic() - started < 10
        assert gateway.health()["holds"]["timed_out"] == 1
        assert desired(idle) == 1  # woken, just not fast enough (nothing reconciles it here)
        time.sleep(2)  # a shipping round or two
        assert not UsageRecord.objects.filter(request_id=reply.headers["x-request-id"]).exists()
    finally:
        gateway.stop()


def test_a_client_that_disconnects_while_held_is_dropped_and_never_served(world, fleet):
    gateway, alice = fleet["gateway"], fleet["tokens"]["alice"]
    idle = idle_deployment(world, fleet)
    body = json.dumps({"model": "idle", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    client = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    client.request(
        "POST",
        "/v1/chat/completions",
        body=body,
        headers={"Authorization": f"Bearer {alice}", "Content-Type": "application/json"},
    )
    wait_for(lambda: holding(gateway, 1), timeout=10)
    client.close()  # the client gives up
    wait_for(lambda: gateway.health()["holds"]["dropped_disconnected"] == 1, timeout=10)
    assert holding(gateway, 0)
    until_ready(idle)
    publish(gateway)
    time.sleep(2)  # a shipping round or two
    assert not UsageRecord.objects.filter(deployment=idle).exists()  # it never reached the engine
    holds = gateway.health()["holds"]
    assert (holds["held"], holds["released"], holds["timed_out"]) == (1, 0, 0)


def test_with_the_control_plane_down_held_requests_time_out_and_the_rest_is_served(world, fleet, tmp_path):
    idle = idle_deployment(world, fleet)
    cable = Forwarder(urlsplit(fleet["live"].url).port or 80)
    gateway = Gateway(
        cable.url,
        fleet["gateway_token"],
        tmp_path / "down.json",
        tmp_path / "down.log",
        GATEWAY_HOLD_TIMEOUT_SECONDS="4",
    )
    alice = fleet["tokens"]["alice"]
    try:
        cable.cut()  # the control plane is gone for this gateway
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(chat, gateway, alice, "idle")
            wait_for(lambda: holding(gateway, 1), timeout=10)
            served = chat(gateway, alice)  # a model that is up is served as ever
            assert served.status_code == 200
            reply = held.result(timeout=20)
        assert reply.status_code == 504 and reply.json()["error"]["code"] == "activation_timeout"
        holds = gateway.health()["holds"]
        assert holds["activation_errors"] >= 1 and holds["activations"] == 0 and holds["held_now"] == 0
        assert desired(idle) == 0  # nothing reached the control plane
        assert gateway.health()["usage"]["backlog"] == 1  # the served request, kept for later
        cable.restore()
        wait_for(lambda: gateway.health()["usage"]["backlog"] == 0, timeout=20)
        assert UsageRecord.objects.filter(request_id=served.headers["x-request-id"]).count() == 1
        assert not UsageRecord.objects.filter(request_id=reply.headers["x-request-id"]).exists()
        assert chat(gateway, alice).status_code == 200
    finally:
        gateway.stop()
        cable.cut()
