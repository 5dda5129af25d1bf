"""Analysis cost with many concurrent rollouts: queries and wall time per analysis run (``measure()``).

A synthetic exporter in this process exposes vLLM's ``vllm:time_to_first_token_seconds`` histogram (vLLM's
buckets) and the ``vllm:num_requests_waiting`` gauge for every rollout's baseline and candidate engine,
each series with its own ``instance`` label (Prometheus honours them: no engine exists or is called); a
real Prometheus (Debian's binary) scrapes it every second. Each rollout's deployment also gets gateway
usage records in the window. The first tenth of the candidates are 30 % slower, so their analyses fail.
Then ``measure()`` runs for every rollout with the default spec (gateway TTFT, gateway error rate, vLLM's
TTFT histogram), first one after another, then all at once on as many threads, and the figures print.
Run by hand (it prints figures; it is not a test):

    .venv/bin/python bench/rollout_analysis_bench.py [--rollouts 100] [--window 30] [--requests 200]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cp_bench .venv/bin/python bench/rollout_analysis_bench.py

It uses a throw-away SQLite database in a temporary folder unless DATABASE_URL is set (the database is
flushed). Deployments are inserted directly (admission is not what is measured here).
"""

import argparse
import math
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="cp-bench-"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("LOG_LEVEL", "ERROR")

import django  # noqa: E402

django.setup()

import requests  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from billing.models import UsageRecord  # noqa: E402
from core.models import Tenant  # noqa: E402
from regions.engines.simulator import TTFT_BUCKETS, Histogram  # noqa: E402
from regions.models import Deployment  # noqa: E402
from registry.models import ModelVersion, RegisteredModel  # noqa: E402
from rollouts.analysis import DEFAULT_SPEC, FAILED, verdict  # noqa: E402
from rollouts.metrics import Side, measure  # noqa: E402

MEDIAN_TTFT, SIGMA, SLOWER = 0.3, 0.3, 1.3
OBSERVATIONS_PER_SECOND = 5  # per engine, in the synthetic histograms


class Exporter:
    """Histograms and gauges for every engine, advanced by the time elapsed at each scrape."""

    def __init__(self, instances: dict[str, float]):  # instance → how much slower than the baseline
        self.slower, self.lock, self.rng = instances, threading.Lock(), random.Random(1)
        self.histograms = {instance: Histogram(TTFT_BUCKETS) for instance in instances}
        self.last = time.monotonic()

    def text(self) -> str:
        with self.lock:
            now = time.monotonic()
            for instance, histogram in self.histograms.items():
                for _ in range(round(OBSERVATIONS_PER_SECOND * (now - self.last))):
                    histogram.observe(
                        self.slower[instance] * self.rng.lognormvariate(math.log(MEDIAN_TTFT), SIGMA)
                    )
            self.last = now
            lines = []
            for instance, histogram in self.histograms.items():
                labels = f'instance="{instance}",model_name="bench",engine="0"'
                lines += histogram.lines("vllm:time_to_first_token_seconds", labels)[1:]
                lines.append(f"vllm:num_requests_waiting{{{labels}}} 0.0")
        head = ["# TYPE vllm:time_to_first_token_seconds histogram", "# TYPE vllm:num_requests_waiting gauge"]
        return "\n".join([*head, *lines]) + "\n"

    def serve(self) -> ThreadingHTTPServer:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                data = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def start_prometheus(folder: Path, exporter_port: int) -> tuple[subprocess.Popen, str]:  # type: ignore[type-arg]
    port = free_port()
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n  - job_name: engines\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
    )
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=(folder / "prometheus.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SystemExit("Prometheus did not start")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prometheus_now(url: str) -> datetime:
    reply = requests.get(f"{url}/api/v1/query", params={"query": "time()"}, timeout=5).json()
    return datetime.fromtimestamp(float(reply["data"]["result"][0]), tz=UTC)


def queries_served(url: str) -> float:
    """Prometheus's own count of instant queries answered (its /metrics), to count what measure() asks."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line
    )


def setup_world(rollouts: int) -> list[Deployment]:
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    tenant = Tenant.objects.create(slug="bench", name="Bench", residency=["EU"])
    model = RegisteredModel.objects.create(owner=tenant, name="llama")
    version = ModelVersion.objects.create(
        model=model,
        version="1.0.0",
        status="production",
        artifact_uri="s3://models/llama/",
        artifact_sha256="a" * 64,
        artifact_size_bytes=16 * 1024**3,
        artifact_format="safetensors",
        served_model_name="llama",
        runtime_version="0.33.0",
        runtime_image="vllm/vllm-openai:v0.33.0",
        max_context_length=8192,
        parameter_count=8_000_000_000,
        dtype="bfloat16",
        allowed_jurisdictions=["EU"],
        created_by_name="bench",
    )
    return Deployment.objects.bulk_create(
        Deployment(
            owner=tenant, name=f"d{n}", model=model, version=version, gpu_type="L4", created_by_name="b"
        )
        for n in range(rollouts)
    )


def sides(n: int) -> tuple[Side, Side]:
    baseline = Side("llama@1.0.0", (f"http://engine-{n}-stable.bench:8000",), ("stable",))
    return Side("llama@2.0.0", (f"http://engine-{n}-candidate.bench:8000",), ("candidate",)), baseline


def add_usage(deployments: list[Deployment], start: datetime, window: int, per_side: int, slow: int) -> int:
    rng, rows = random.Random(2), []
    for n, deployment in enumerate(deployments):
        candidate, baseline = sides(n)
        for side, count in ((baseline, per_side), (candidate, per_side // 4)):  # a 20 % canary
            factor = SLOWER if side is candidate and n < slow else 1.0
            for _ in range(count):
                at = start + timedelta(seconds=rng.uniform(0, window))
                ttft = factor * rng.lognormvariate(math.log(MEDIAN_TTFT), SIGMA) * 1000
                rows.append(
                    UsageRecord(
                        request_id=uuid.uuid4().hex,
                        tenant=deployment.owner,
                        model_name=deployment.name,
                        region="eu-west-1",
                        deployment=deployment,
                        version=side.version,
                        track=side.tracks[0],
                        status=200,
                        completion_tokens=64,
                        latency_ms=ttft + 640,
                        ttft_ms=ttft,
                        stream=True,
                        started_at=at,
                        hour=at.replace(minute=0, second=0, microsecond=0),
                    )
                )
    UsageRecord.objects.bulk_create(rows, batch_size=5000)
    return len(rows)


def analyse(
    n: int, deployment: Deployment, url: str, start: datetime, end: datetime
) -> tuple[float, str, str]:
    candidate, baseline = sides(n)
    began = time.perf_counter()
    measured = measure(
        DEFAULT_SPEC,
        deployment_id=deployment.pk,
        region_code="eu-west-1",
        prometheus_url=url,
        candidate=candidate,
        baseline=baseline,
        start=start,
        end=end,
    )
    failing = ", ".join(m.metric for m in measured if m.verdict == FAILED)
    return time.perf_counter() - began, verdict(measured), failing


def summary(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return f"p50 {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms, max {ms[-1]:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--window", type=int, default=30, help="seconds of the analysis window")
    parser.add_argument(
        "--requests", type=int, default=200, help="baseline requests per rollout in the window"
    )
    args = parser.parse_args()
    if not shutil.which("prometheus"):
        raise SystemExit("Prometheus is not installed (apt-get install prometheus)")
    slow = max(1, args.rollouts // 10)
    deployments = setup_world(args.rollouts)
    instances = {}
    for n in range(args.rollouts):
        candidate, baseline = sides(n)
        instances[baseline.endpoints[0].split("://")[1]] = 1.0
        instances[candidate.endpoints[0].split("://")[1]] = SLOWER if n < slow else 1.0
    folder = Path(tempfile.mkdtemp(prefix="cp-bench-prometheus-"))
    exporter = Exporter(instances).serve()
    prometheus, url = start_prometheus(folder, exporter.server_address[1])
    try:
        print(
            f"database: {connection.vendor}; rollouts: {args.rollouts} ({slow} with a 30 % slower candidate)"
        )
        print(f"warming up: {args.window + 5} s of 1 s scrapes of {len(instances)} engines' series...")
        time.sleep(args.window + 5)
        end = prometheus_now(url)
        start = end - timedelta(seconds=args.window)
        rows = add_usage(deployments, start, args.window, args.requests, slow)
        print(f"usage records in the window: {rows}; spec: {len(DEFAULT_SPEC.metrics)} metrics (the default)")

        before = queries_served(url)
        seconds, verdicts, failing, db_queries = [], [], {}, 0
        began = time.perf_counter()
        for n, deployment in enumerate(deployments):
            with CaptureQueriesContext(connection) as captured:
                took, found, which = analyse(n, deployment, url, start, end)
            seconds.append(took)
            verdicts.append(found)
            failing.update({n: which} if which else {})
            db_queries += len(captured)
        sequential = time.perf_counter() - began
        prometheus_queries = queries_served(url) - before
        per_run = (
            f"{prometheus_queries / args.rollouts:.1f} Prometheus, {db_queries / args.rollouts:.1f} database"
        )
        print(f"one after another: {sequential:.2f} s for {args.rollouts} runs; per run {summary(seconds)}")
        print(f"queries per run: {per_run}")
        counts = {v: verdicts.count(v) for v in sorted(set(verdicts))}
        print(f"verdicts: {counts}; failed (rollout: metrics): {failing}")

        def run(n: int) -> tuple[float, str, str]:
            try:
                return analyse(n, deployments[n], url, start, end)
            finally:
                connection.close()  # each thread's own connection

        began = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.rollouts) as pool:
            results = list(pool.map(run, range(args.rollouts)))
        together = time.perf_counter() - began
        same = [v for _, v, _ in results] == verdicts
        print(
            f"all at once ({args.rollouts} threads): {together:.2f} s in all; per run "
            f"{summary([s for s, _, _ in results])}; same verdicts: {same}"
        )
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        exporter.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
