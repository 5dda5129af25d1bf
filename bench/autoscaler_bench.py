"""One autoscaler pass over 1,000 deployments × 5 regions on PostgreSQL, with signals from a real Prometheus.

The fleet is inserted in bulk into its own database (created if missing, dropped at the end unless
--keep): 5 process regions, 1,000 autoscaled deployments of one replica in each region (5,000 targets,
each ready with one endpoint). The signals come from a real Prometheus (Debian's ``prometheus``, 1 s
scrapes) reading one exporter that serves vLLM's three gauges for all 5,000 endpoints (``honor_labels``,
so each series keeps its endpoint's ``instance``); one Prometheus answers for all five regions, which the
pass asks once (four queries, each returning the fleet's 5,000 series: what five regional Prometheus
servers would return together). With ``--signals probes`` (or no Prometheus installed) they come from the
router's probe rows instead.

It prints the first pass (the scaler states created), the median and the slowest of 5 steady passes 15 s
apart (nothing scales; each writes the timeline points of about a quarter of the states), a pass where
1 % of the deployments scale, the queries and writes of each, and the time from a signal crossing its
target to the new replica count being written.

    .venv/bin/python bench/autoscaler_bench.py [--deployments 1000] [--signals prometheus|probes]
    (DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/autoscaler_bench)
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/autoscaler_bench")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="cp-autoscaler-bench-"))
os.environ.setdefault("LOG_LEVEL", "ERROR")
REGIONS = 5
BUSY_SHARE = 0.01  # the deployments that scale in the "scaling" pass


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("select 1 from pg_database where datname = %s", [name]).fetchone():
            conn.execute(f'create database "{name}"')


def drop_database(url: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}"')


class Exporter:
    """vLLM's gauges for every endpoint of the fleet, served as one /metrics page."""

    def __init__(self) -> None:
        self.load: dict[str, tuple[float, float, float]] = {}  # instance: (running, waiting, kv_cache)
        self.rendered: str | None = None
        self.lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.page().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def page(self) -> str:
        """The page, rendered again only after a change (the exporter shares the pass's process)."""
        with self.lock:
            if self.rendered is None:
                self.rendered = self.render(dict(self.load))
            return self.rendered

    def render(self, load: dict[str, tuple[float, float, float]]) -> str:
        lines = []
        for index, name in enumerate(("running", "waiting", "kv_cache")):
            metric = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}.get(
                name, "vllm:kv_cache_usage_perc"
            )
            lines.append(f"# TYPE {metric} gauge")
            lines += [f'{metric}{{instance="{i}",model_name="chat"}} {v[index]}' for i, v in load.items()]
        return "\n".join(lines) + "\n"

    def set(self, instance: str, running: float, waiting: float = 0.0, kv_cache: float = 0.3) -> None:
        with self.lock:
            self.load[instance] = (running, waiting, kv_cache)
            self.rendered = None


@contextmanager
def prometheus(exporter: Exporter, folder: Path) -> Iterator[str]:
    from tests.support.processes import free_port, wait_for
    from tests.support.prometheus import _ok

    port = free_port()
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n  - job_name: vllm\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]\n"
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
    try:
        wait_for(lambda: _ok(f"{url}/-/ready"), timeout=60)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def build_fleet(count: int, prometheus_url: str, folder: Path) -> tuple[list[Any], Any]:
    """Regions, prices, one tenant's ``count`` deployments in every region, their policies and targets."""
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from autoscaling.models import AutoscalingPolicy
    from autoscaling.policy import parse
    from billing.models import GpuPrice
    from core.models import Tenant
    from regions.models import Deployment, DeploymentTarget, GpuPool, Region
    from registry.models import ModelVersion, RegisteredModel

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    now = timezone.now()
    regions = []
    for n in range(REGIONS):
        region = Region.objects.create(
            code=f"eu-bench-{n}",
            name=f"Bench {n}",
            provider="local",
            jurisdiction="EU",
            driver="process",
            driver_config={"state_dir": str(folder / f"r{n}"), "engine": "simulator"},
            prometheus_url=prometheus_url,
        )
        GpuPool.objects.create(region=region, gpu_type="L4", memory_gib=24, gpu_count=100_000)
        GpuPrice.objects.create(
            region=region,
            gpu_type="L4",
            hourly_price=Decimal("1.00") + n,
            effective_from=now - timedelta(days=30),
        )
        regions.append(region)
    tenant = Tenant.objects.create(slug="bench", name="Bench", residency=["EU"])
    model = RegisteredModel.objects.create(owner=tenant, name="chat")
    version = ModelVersion.objects.create(
        model=model,
        version="1.0.0",
        status="production",
        artifact_uri="s3://models/chat/",
        artifact_sha256="a" * 64,
        artifact_size_bytes=1024,
        artifact_format="safetensors",
        served_model_name="chat",
        runtime_version="0.33.0",
        runtime_image="vllm/vllm-openai:v0.33.0",
        max_context_length=512,
        parameter_count=3_000_000,
        dtype="float32",
        allowed_jurisdictions=["EU"],
        created_by_name="bench",
    )
    deployments = Deployment.objects.bulk_create(
        [
            Deployment(
                owner=tenant,
                name=f"d{n}",
                model=model,
                version=version,
                gpu_type="L4",
                created_by_name="bench",
            )
            for n in range(count)
        ],
        batch_size=1000,
    )
    spec = parse({"running": 4, "waiting": 2, "max_replicas": 8}).as_dict()
    AutoscalingPolicy.objects.bulk_create(
        [AutoscalingPolicy(deployment=d, spec=spec, updated_by_name="bench") for d in deployments],
        batch_size=1000,
    )
    DeploymentTarget.objects.bulk_create(
        [
            DeploymentTarget(
                deployment=d,
                region=r,
                status="ready",
                ready_replicas=1,
                endpoints=[endpoint(r_index, d_index)],
                last_transition_at=now - timedelta(days=1),
            )
            for d_index, d in enumerate(deployments)
            for r_index, r in enumerate(regions)
        ],
        batch_size=2000,
    )
    with connection.cursor() as cursor:
        cursor.execute("analyze")  # as autovacuum would after such inserts: the planner's estimates
    return regions, deployments


def endpoint(region_index: int, deployment_index: int) -> str:
    return f"http://10.{region_index}.{deployment_index // 250}.{deployment_index % 250}:8000"


def instance(url: str) -> str:
    return url.split("://", 1)[1]


def write_probes(regions: list[Any], count: int, running: Callable[[int], float], at: Any) -> None:
    """The router's probe rows for every endpoint (the fallback's storage), as one bulk upsert."""
    from routing.models import EndpointHealth

    rows = [
        EndpointHealth(url=endpoint(r, d), region=regions[r], running=running(d), kv_cache=0.3, checked_at=at)
        for r in range(len(regions))
        for d in range(count)
    ]
    EndpointHealth.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["url"],
        update_fields=["running", "waiting", "kv_cache", "checked_at"],
        batch_size=2000,
    )


def fill_timelines(now: Any) -> None:
    """An hour of timeline points in every state, as after the first hour (the rows the passes rewrite)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            update autoscaling_scalerstate set samples = (
                select jsonb_agg(jsonb_build_array(%s - 60 * (60 - n), 1,
                                 jsonb_build_object('running', 4.0, 'waiting', 0.0, 'kv_cache', 0.3)))
                from generate_series(1, 60) as n)
            """,
            [now.timestamp()],
        )
        cursor.execute("analyze autoscaling_scalerstate")


def timed_pass(now: Any) -> tuple[float, int, int, Any]:
    """(seconds, queries, writes, report) of one pass."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from autoscaling import evaluator

    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        report = evaluator.evaluate_all(now=now)
        seconds = time.perf_counter() - started
    writes = sum(1 for q in queries if not q["sql"].lstrip().upper().startswith("SELECT"))
    return seconds, len(queries), writes, report


def signal_time() -> dict[str, float]:
    """Seconds spent asking for signals per pass (wrapped around ``signals.region_values``)."""
    from autoscaling import signals

    spent = {"seconds": 0.0}
    original = signals.region_values

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent["seconds"] += time.perf_counter() - started

    signals.region_values = timed  # type: ignore[assignment]
    return spent


def line(label: str, measured: tuple[float, int, int, Any], extra: str = "") -> None:
    seconds, queries, writes, _ = measured
    print(f"{label:<46} {seconds:6.2f} s {queries:6} queries {writes:5} writes{extra}")


def scale_some(exporter: Exporter, regions: list[Any], count: int, busy: set[int], start: Any, probes: bool):  # type: ignore[no-untyped-def]
    """1 % of the deployments get 12 running on every replica (each region wants 3); passes run back to
    back until a new count is written. Returns (seconds from the change, passes, the last pass)."""
    from regions.models import DeploymentTarget

    crossing = time.perf_counter()
    for d in busy:
        for r in range(REGIONS):
            exporter.set(instance(endpoint(r, d)), running=12.0)
    at, passes = start, 0
    while True:
        if probes:
            write_probes(regions, count, lambda d: 12.0 if d in busy else 4.0, at)
        last = timed_pass(at)
        passes += 1
        if DeploymentTarget.objects.filter(desired_replicas__gt=1).exists() or passes == 120:
            return time.perf_counter() - crossing, passes, last
        at += timedelta(seconds=1)


def run(count: int, use_prometheus: bool, prom_url: str, exporter: Exporter, folder: Path) -> None:
    from django.utils import timezone

    from regions.models import DeploymentTarget

    regions, _ = build_fleet(count, prom_url, folder)
    for r in range(REGIONS):
        for d in range(count):
            exporter.set(instance(endpoint(r, d)), running=4.0)  # on target: 4 running per replica
    spent = signal_time()
    print(f"PostgreSQL; {count} deployments × {REGIONS} regions = {count * REGIONS} targets")
    print(f"signals: {'a real Prometheus' if use_prometheus else 'the probe rows (EndpointHealth)'}")
    if use_prometheus:
        wait_scraped(prom_url, count * REGIONS)
    now = timezone.now()
    write_probes(regions, count, lambda d: 4.0, now)
    line("first pass (the states created)", timed_pass(now))
    fill_timelines(now)
    steady = []
    for n in range(1, 6):  # passes at the beat's 15 s: each writes about a quarter's timeline points
        at = now + timedelta(seconds=n * 15)
        if not use_prometheus:
            write_probes(regions, count, lambda d: 4.0, at)
        spent["seconds"] = 0.0
        measured = timed_pass(at)
        steady.append((*measured[:3], spent["seconds"]))
    median = statistics.median(s[0] for s in steady)
    signals_share = statistics.median(s[3] for s in steady)
    worst = max(steady, key=lambda s: s[0])
    line("steady pass, no scaling (median of 5)", (median, *steady[0][1:3], None))
    print(f"  of which asking for the signals: {signals_share:.2f} s")
    line("steady pass, no scaling (the slowest of 5)", (*worst[:3], None))
    busy = set(range(0, count, int(1 / BUSY_SHARE)))
    seconds, passes, last = scale_some(
        exporter, regions, count, busy, now + timedelta(seconds=130), not use_prometheus
    )
    scaled = DeploymentTarget.objects.filter(desired_replicas__gt=1).count()
    line(f"scaling pass ({len(busy)} deployments, {scaled} regions scaled)", last)
    print(
        f"signal crossing its target → new replicas written: {seconds:.2f} s, {passes} back-to-back pass(es)"
    )
    if use_prometheus:
        print(
            "  (Prometheus: a 1 s scrape, then the 60 s average must cross the target by the 10 % tolerance)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--signals", choices=["prometheus", "probes"], default="prometheus")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database")
    args = parser.parse_args()
    use_prometheus = args.signals == "prometheus" and bool(shutil.which("prometheus"))
    url = os.environ["DATABASE_URL"]
    ensure_database(url)
    import django

    django.setup()
    exporter = Exporter()
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name)
        with prometheus(exporter, folder) if use_prometheus else _nothing() as prom_url:
            run(args.deployments, use_prometheus, prom_url, exporter, folder)
    if not args.keep:
        drop_database(url)


@contextmanager
def _nothing() -> Iterator[str]:
    yield ""


def wait_scraped(url: str, series: int) -> None:
    from regions.drivers.prometheus import prometheus_client
    from tests.support.processes import wait_for

    client = prometheus_client(url)

    def scraped() -> bool:
        found = client.custom_query("count(vllm:num_requests_running)")
        return bool(found) and int(float(found[0]["value"][1])) >= series

    wait_for(scraped, timeout=120, interval=1)
    time.sleep(5)  # a few samples in the averaging window


if __name__ == "__main__":
    main()
