"""Collecting a step's samples: the gateway's records split by version and track inside the window, vLLM's
histograms from a real Prometheus scraping simulator engines, and a Prometheus that is down or hangs
making its metrics inconclusive instead of raising."""

import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from billing.models import UsageRecord
from regions.services.deployments import deployment_create
from rollouts import metrics
from rollouts.analysis import FAILED, INCONCLUSIVE, SUCCESSFUL, AnalysisSpec, MetricSpec
from rollouts.metrics import Side, measure
from tests.support.principals import principal
from tests.support.processes import free_port, wait_for
from tests.support.prometheus import INSTALLED, NOT_INSTALLED
from tests.support.regions import tiny_version

ROOT = Path(__file__).resolve().parents[2]
START = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)  # the window: ten minutes from START
END = START + timedelta(minutes=10)
V1, V2 = "tiny-llama@1.0.0", "tiny-llama@2.0.0"
BASELINE = Side(version=V1, endpoints=("http://127.0.0.1:9001",), tracks=("stable",))
CANARY = Side(version=V2, endpoints=("http://127.0.0.1:9002",), tracks=("candidate",))
GATEWAY_SPEC = AnalysisSpec(
    metrics=(
        MetricSpec("ttft", "gateway", "p50", max_ratio=1.1),
        MetricSpec("latency", "gateway", "p50", max=5.0),
        MetricSpec("tokens_per_second", "gateway", "p50", min_ratio=0.9),
        MetricSpec("error_rate", "gateway", "rate", max_increase=0.01),
    ),
    min_samples=20,
    alpha=0.05,
)
VLLM_TTFT = MetricSpec("vllm:time_to_first_token_seconds", "prometheus", "p95", max_ratio=1.1)
WAITING = MetricSpec("vllm:num_requests_waiting", "prometheus", "mean", max=1.0)
PROMETHEUS_SPEC = AnalysisSpec(metrics=(VLLM_TTFT, WAITING), min_samples=20)


@pytest.fixture
def chat(world, make_region, tiny_model_dir):  # type: ignore[no-untyped-def]
    make_region("eu-west-1", "EU")
    version = tiny_version(principal(world.operator), tiny_model_dir)
    return deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=version.model, version="1.0.0"
    )


def records(chat, count: int, **fields) -> None:  # type: ignore[no-untyped-def]
    """``count`` usage records of ``chat`` inside the window (one a second from START), ``fields``
    overriding (``deployment=None``: a record of no deployment)."""
    values = {
        "version": V1,
        "track": "stable",
        "region": "eu-west-1",
        "status": 200,
        "latency_ms": 1100.0,
        "ttft_ms": 100.0,
        "completion_tokens": 100,
        "stream": True,
        **fields,
    }
    at, served_by = values.pop("at", START), values.pop("deployment", chat)
    UsageRecord.objects.bulk_create(
        UsageRecord(
            request_id=uuid.uuid4().hex,
            tenant=chat.owner,
            model_name=chat.name,
            deployment=served_by,
            started_at=at + timedelta(seconds=n),
            hour=at.replace(minute=0, second=0),
            **values,
        )
        for n in range(count)
    )


def test_gateway_metrics_count_each_sides_records_in_the_window_only(chat, django_assert_num_queries):
    records(chat, 40)  # the baseline: TTFT 0.1 s, 1.1 s in all, 100 tokens in 1 s of decoding
    records(chat, 40, version=V2, track="candidate", ttft_ms=200.0, latency_ms=1200.0)  # TTFT doubled
    records(chat, 5, version=V2, track="candidate", stream=False, ttft_ms=None, latency_ms=300.0)
    records(chat, 8, version=V2, track="candidate", status=503, latency_ms=10.0, ttft_ms=None)
    records(chat, 2, version=V2, track="candidate", status=499)  # the client went away: not counted
    records(chat, 2, version=V2, track="candidate", status=404)  # the client's error: no engine error
    # None of these belongs to either side's window:
    records(chat, 9, version=V2, track="mirror", ttft_ms=5000.0)  # a shadow copy, not canary traffic
    records(chat, 9, version=V2, track="candidate", region="eu-central-1", ttft_ms=5000.0)
    records(chat, 9, version=V2, track="candidate", at=START - timedelta(seconds=9), ttft_ms=5000.0)
    records(chat, 9, version=V2, track="candidate", at=END, ttft_ms=5000.0)
    records(chat, 9, version=V2, track="candidate", deployment=None, ttft_ms=5000.0)
    with django_assert_num_queries(1):  # one query for every gateway metric of the spec
        ttft, latency, speed, errors = measure(
            GATEWAY_SPEC,
            deployment_id=chat.pk,
            region_code="eu-west-1",
            prometheus_url="",
            candidate=CANARY,
            baseline=BASELINE,
            start=START,
            end=END,
        )
    assert (ttft.candidate_samples, ttft.baseline_samples) == (45, 40)  # + 5 unstreamed: their latency
    assert (ttft.candidate, ttft.baseline) == (0.2, 0.1) and ttft.verdict == FAILED, ttft
    assert "version=tiny-llama@2.0.0 track in (candidate)" in ttft.query and "started_at <" in ttft.query
    assert (latency.candidate_samples, latency.candidate, latency.verdict) == (45, 1.2, SUCCESSFUL)
    assert (speed.candidate_samples, speed.candidate, speed.baseline) == (40, 100.0, 100.0)
    assert speed.verdict == SUCCESSFUL
    assert (errors.candidate_samples, errors.baseline_samples) == (55, 40)  # 40 + 5 + 8 errors + 2 × 404
    assert (errors.candidate, errors.baseline) == (8 / 55, 0.0) and errors.verdict == FAILED, errors


def test_candidate_attempts_retried_on_the_baseline_count_as_the_candidates_errors(chat):
    records(chat, 200)
    records(chat, 200, version=V2, track="candidate")
    records(chat, 12, candidate_errors=1)  # answered by the baseline after the candidate failed first
    (errors,) = measure(
        AnalysisSpec((GATEWAY_SPEC.metrics[3],), min_samples=20),
        deployment_id=chat.pk,
        region_code="eu-west-1",
        prometheus_url="",
        candidate=CANARY,
        baseline=BASELINE,
        start=START,
        end=END,
    )
    assert (errors.candidate_samples, errors.baseline_samples) == (212, 212), errors
    assert errors.candidate == 12 / 212 and errors.baseline == 0.0 and errors.verdict == FAILED, errors


def test_a_shadow_candidate_is_judged_on_its_mirrored_requests(chat):
    records(chat, 30)
    records(chat, 30, version=V2, track="mirror", ttft_ms=105.0)
    shadow = Side(version=V2, endpoints=CANARY.endpoints, tracks=("mirror",))
    (ttft,) = measure(
        AnalysisSpec((GATEWAY_SPEC.metrics[0],)),
        deployment_id=chat.pk,
        region_code="eu-west-1",
        prometheus_url="",
        candidate=shadow,
        baseline=BASELINE,
        start=START,
        end=END,
    )
    assert (ttft.candidate_samples, ttft.candidate, ttft.verdict) == (30, 0.105, SUCCESSFUL), ttft


def judge_prometheus(url: str, spec: AnalysisSpec = PROMETHEUS_SPEC, **sides: Side) -> list:  # type: ignore[type-arg]
    sides = {"candidate": CANARY, "baseline": BASELINE, **sides}
    return measure(
        spec, deployment_id=1, region_code="eu-west-1", prometheus_url=url, start=START, end=END, **sides
    )


def test_no_prometheus_or_no_endpoints_is_inconclusive_saying_why():
    ttft, waiting = judge_prometheus("")
    assert ttft.verdict == waiting.verdict == INCONCLUSIVE and ttft.reason == "the region names no Prometheus"
    assert ttft.query.startswith("sum by (instance, le) (increase(vllm:time_to_first_token_seconds_bucket{")
    assert "[600s]" in ttft.query and waiting.query.startswith("vllm:num_requests_waiting{instance=~`")
    (ttft,) = judge_prometheus(
        "http://127.0.0.1:9", AnalysisSpec((VLLM_TTFT,)), candidate=Side(V2, (), ("x",))
    )
    assert ttft.verdict == INCONCLUSIVE and ttft.reason == "no engine endpoints for the candidate"


def test_a_prometheus_that_is_down_makes_its_metrics_inconclusive_and_is_asked_once():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    ttft, waiting = judge_prometheus(url)
    assert ttft.verdict == waiting.verdict == INCONCLUSIVE
    assert ttft.reason.startswith(f"Prometheus at {url} did not answer: ") and waiting.reason == ttft.reason


@pytest.fixture
def hung_prometheus(monkeypatch) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A port that accepts connections and never answers."""
    monkeypatch.setattr(metrics, "READ_TIMEOUT_SECONDS", 0.3)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_prometheus_that_hangs_costs_one_timeout_and_no_exception(hung_prometheus):
    ttft, waiting = judge_prometheus(hung_prometheus)
    assert ttft.verdict == waiting.verdict == INCONCLUSIVE
    assert "did not answer" in ttft.reason and "timed out" in ttft.reason, ttft.reason


# --- a real Prometheus scraping simulator engines ------------------------------------------------------


def start_engine(tmp_path: Path, ttft_delay: float) -> tuple[str, subprocess.Popen]:  # type: ignore[type-arg]
    port = free_port()
    command = [sys.executable, "-m", "regions.engines.simulator", "--model", "tiny", "--port", str(port)]
    log = (tmp_path / f"engine-{port}.log").open("w")
    proc = subprocess.Popen([*command, "--ttft-delay", str(ttft_delay)], cwd=ROOT, stdout=log, stderr=log)
    return f"http://127.0.0.1:{port}", proc


def ask(url: str, query: str) -> list:  # type: ignore[type-arg]
    reply = requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=5)
    return reply.json()["data"]["result"]


def prometheus_now(url: str) -> datetime:
    """Prometheus's own clock: the window must be its time, whatever clock the test process has."""
    reply = requests.get(f"{url}/api/v1/query", params={"query": "time()"}, timeout=5).json()
    return datetime.fromtimestamp(float(reply["data"]["result"][0]), tz=UTC)


def streamed(engine: str) -> None:
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "stream": True}
    with requests.post(f"{engine}/v1/completions", json=body, stream=True, timeout=10) as reply:
        assert reply.status_code == 200 and reply.content.endswith(b"data: [DONE]\n\n")


@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED, reason=NOT_INSTALLED)
def test_a_slower_engine_fails_on_vllms_ttft_histogram_and_an_equal_one_passes(prometheus, tmp_path):
    url, scrape = prometheus
    engines = [start_engine(tmp_path, delay) for delay in (0.15, 0.15, 0.6)]  # baseline, equal, slow
    baseline, equal, slow = (engine for engine, _ in engines)
    try:
        wait_for(lambda: all(_healthy(engine) for engine in (baseline, equal, slow)), timeout=20)
        scrape([baseline, equal, slow])
        wait_for(lambda: len(ask(url, "vllm:time_to_first_token_seconds_count")) == 3, timeout=20)
        start = prometheus_now(url) - timedelta(seconds=2)  # the empty histograms' first scrape inside
        with ThreadPoolExecutor(max_workers=12) as pool:
            list(pool.map(streamed, [baseline, equal, slow] * 30))
        sent = "sum(vllm:time_to_first_token_seconds_count)"
        wait_for(lambda: (found := ask(url, sent)) and float(found[0]["value"][1]) == 90, timeout=20)
        end = prometheus_now(url) + timedelta(seconds=0.1)
        sides = {"baseline": Side(V1, (baseline,), ("stable",)), "start": start, "end": end}
        judged = {
            name: measure(
                PROMETHEUS_SPEC,
                deployment_id=1,
                region_code="eu-west-1",
                prometheus_url=url,
                candidate=Side(V2, (engine,), ("candidate",)),
                **sides,  # type: ignore[arg-type]
            )
            for name, engine in (("equal", equal), ("slow", slow))
        }
    finally:
        for _, proc in engines:
            proc.terminate()
            proc.wait(timeout=10)
    ttft, waiting = judged["slow"]
    assert ttft.verdict == FAILED and ttft.candidate > 0.5 and ttft.baseline < 0.25, ttft
    # 30 requests each. increase() extrapolates the first and last scrapes out to the window's edges (up to
    # 1.1 scrape intervals each side), so a count reads above 30: 41 was seen in CI.
    assert 25 <= ttft.candidate_samples <= 50 and 25 <= ttft.baseline_samples <= 50, ttft
    assert waiting.verdict == SUCCESSFUL and waiting.candidate == 0.0 and waiting.candidate_samples >= 3, (
        waiting
    )
    ttft, waiting = judged["equal"]
    assert ttft.verdict == SUCCESSFUL and waiting.verdict == SUCCESSFUL, ttft
    assert ttft.p_value is not None and ttft.p_value > 0.05  # every request in one bucket on both sides


def _healthy(engine: str) -> bool:
    try:
        return requests.get(f"{engine}/health", timeout=1).status_code == 200
    except requests.RequestException:
        return False
