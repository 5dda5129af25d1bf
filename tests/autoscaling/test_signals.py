"""The signals from a real Prometheus scraping two endpoints over HTTP (each serves vLLM's gauges and TTFT
histogram): per-replica values per target from a handful of queries, a value JSON cannot hold dropped,
and the probes' rows used when the Prometheus is gone."""

import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
from django.utils import timezone

from autoscaling import evaluator, signals
from autoscaling.models import ScalerState
from regions.models import DeploymentTarget, Region
from routing.models import EndpointHealth
from tests.support.autoscaling import autoscale, deploy, replicas
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.prometheus import INSTALLED, NOT_INSTALLED
from tests.support.regions import tiny_version

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not INSTALLED, reason=NOT_INSTALLED)]
BUCKETS = (0.1, 0.5, 1.0)


class Engine:
    """One endpoint's /metrics: fixed gauges, and a TTFT histogram that takes ``ttft`` once per scrape."""

    def __init__(self, running: float, waiting: float, kv_cache: str, ttft: float) -> None:
        self.gauges = {
            "vllm:num_requests_running": str(running),
            "vllm:num_requests_waiting": str(waiting),
            "vllm:kv_cache_usage_perc": kv_cache,
        }
        self.ttft, self.observed = ttft, 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = engine.page().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def page(self) -> str:
        self.observed += 10
        lines = [f'{name}{{model_name="chat"}} {value}' for name, value in self.gauges.items()]
        histogram = "vllm:time_to_first_token_seconds"
        for bound in (*BUCKETS, "+Inf"):
            count = self.observed if bound == "+Inf" or self.ttft <= float(bound) else 0
            lines.append(f'{histogram}_bucket{{model_name="chat",le="{bound}"}} {count}')
        lines.append(f'{histogram}_count{{model_name="chat"}} {self.observed}')
        return "\n".join(lines) + "\n"


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    # The second one's KV-cache gauge is +Inf (a broken exporter): not a number a state can store.
    found = [Engine(running=10, waiting=1, kv_cache="0.5", ttft=0.3), Engine(2, 3, "+Inf", 0.05)]
    yield found
    for engine in found:
        engine.server.shutdown()


@pytest.fixture
def chat(world, make_region, tiny_model_dir, prometheus, engines):  # type: ignore[no-untyped-def]
    url, scrape = prometheus
    make_region("eu-west-1", "EU", gpus=8, prometheus_url=url)
    alice = principal(world.alice)
    deployment = deploy(
        alice, tiny_version(alice, tiny_model_dir, owner=world.tenant_a), ["eu-west-1"], replicas=2
    )
    DeploymentTarget.objects.filter(deployment=deployment).update(
        status="ready", ready_replicas=2, endpoints=[e.url for e in engines]
    )
    scrape([e.url for e in engines])
    wait_for(lambda: _series(url, "vllm:time_to_first_token_seconds_count") == 2, timeout=30)
    wait_for(lambda: _series(url, "rate(vllm:time_to_first_token_seconds_count[15s]) > 0") == 2, timeout=30)
    return deployment


def _series(url: str, query: str) -> int:
    found = requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=5).json()
    return len(found["data"]["result"])


@pytest.mark.django_db
def test_per_replica_values_come_from_the_regions_prometheus_and_drive_the_pass(world, chat):
    target = DeploymentTarget.objects.select_related("region").get(deployment=chat)
    values, source = signals.region_values(target.region, [target], 15, timezone.now())
    assert source == "prometheus"
    found = values[target.pk]
    assert found["running"] == pytest.approx(6.0) and found["waiting"] == pytest.approx(
        2.0
    )  # (10+2)/2, (1+3)/2
    assert found["kv_cache"] == pytest.approx(0.5)  # +Inf left out: the one finite replica's
    assert 0.1 < found["ttft_p95_seconds"] <= 0.5  # the slower replica's p95, in its bucket
    autoscale(principal(world.alice), chat, running=4, max_replicas=6)
    report = evaluator.evaluate_all(now=timezone.now())
    assert report.sources == {"eu-west-1": "prometheus"}
    assert replicas(chat) == {"eu-west-1": 3}  # ceil(2 × 6 / 4)
    assert ScalerState.objects.get(target=target).signals["running"] == pytest.approx(6.0)


@pytest.mark.django_db
def test_without_its_prometheus_a_region_falls_back_to_the_probes_and_says_why(world, chat, prometheus):
    Region.objects.filter(code="eu-west-1").update(prometheus_url="http://127.0.0.1:9")  # nothing listens
    target = DeploymentTarget.objects.select_related("region").get(deployment=chat)
    now = timezone.now()
    for url in target.endpoints:
        EndpointHealth.objects.create(url=url, region=target.region, running=8, checked_at=now)
    values, source = signals.region_values(target.region, [target], 60, now + timedelta(seconds=1))
    assert source.startswith("probes (Prometheus failed: ")
    assert values[target.pk]["running"] == 8.0 and "ttft_p95_seconds" not in values[target.pk]
