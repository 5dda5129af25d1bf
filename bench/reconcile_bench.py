"""Reconciler benchmark against a Kubernetes API test server speaking the real REST protocol.

For N deployments × 5 regions it measures (1) convergence from empty: passes of the reconciler until every
(deployment, region) is ready, and (2) a no-op pass: everything due again, nothing changed, which must
write nothing to the clusters or the database. For each it reports the seconds, the requests to the
clusters, the SQL statements (and how many of them write) and the reconciler's CPU time, per target.

The API server runs in a process of its own (tests/support/kube_api.py, indexed by kind and namespace),
so the figures are the reconciler's, not its test server's. Run by hand (it prints figures; it is not a
test), on PostgreSQL as in production:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cp_bench .venv/bin/python bench/reconcile_bench.py
    .venv/bin/python bench/reconcile_bench.py --sizes 100    # a throw-away SQLite database

The database is flushed. Deployments are inserted directly (admission is not what is measured here).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="cp-bench-"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("LOG_LEVEL", "ERROR")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db.backends.signals import connection_created  # noqa: E402
from django.utils import timezone  # noqa: E402

from core.models import Tenant  # noqa: E402
from core.principal import Principal  # noqa: E402
from regions.drivers.factory import driver_for  # noqa: E402
from regions.models import Deployment, DeploymentTarget, Region  # noqa: E402
from regions.reconciler import reconcile_region  # noqa: E402
from regions.services.regions import region_create  # noqa: E402
from registry.models import ModelVersion, RegisteredModel  # noqa: E402
from tests.support.kube_api import kubeconfig as cluster_kubeconfig  # noqa: E402

REGIONS = 5


class Statements:
    """Counts the SQL statements of every database connection (each reconcile thread has its own)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total = self.writes = 0
        connection_created.connect(self._watch)

    def _watch(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        connection.execute_wrappers.append(self)

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        count = len(params) if many else 1  # executemany: a statement per row, sent together
        with self.lock:
            self.total += count
            self.writes += count * sql.lstrip().startswith(("INSERT", "UPDATE", "DELETE"))
        return execute(sql, params, many, context)

    def read(self) -> tuple[int, int]:
        with self.lock:
            return self.total, self.writes


class Cluster:
    """The API server in its own process: its URL, its request counts, its CPU time."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.kube_api"], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()

    def requests(self) -> tuple[int, int]:
        with urllib.request.urlopen(f"{self.url}/_requests") as reply:
            counts = json.load(reply)
        return counts["total"], counts["writes"]

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def setup_world(cluster: Cluster, folder: Path) -> tuple[Tenant, ModelVersion, list[Region]]:
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    actor = Principal.system("bench")
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(json.dumps(cluster_kubeconfig(cluster.url)))
    regions = [
        region_create(
            actor=actor,
            code=f"eu-bench-{n}",
            name=f"Bench {n}",
            provider="aws",
            jurisdiction="EU",
            driver="kubernetes",
            reconcile_concurrency=8,
            driver_config={"namespace": f"ns{n}", "kubeconfig_file": str(kubeconfig)},
            gpu_pools=[{"gpu_type": "L4", "memory_gib": 24, "gpu_count": 100_000}],
        )
        for n in range(REGIONS)
    ]
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
    return tenant, version, regions


def add_deployments(
    tenant: Tenant, version: ModelVersion, regions: list[Region], start: int, count: int
) -> None:
    deployments = Deployment.objects.bulk_create(
        [
            Deployment(
                owner=tenant,
                name=f"d{n}",
                model=version.model,
                version=version,
                gpu_type="L4",
                created_by_name="bench",
            )
            for n in range(start, start + count)
        ]
    )
    DeploymentTarget.objects.bulk_create(
        [DeploymentTarget(deployment=d, region=r) for d in deployments for r in regions], batch_size=2000
    )


class Reconcilers:
    """Where the regions' passes run. ``workers=0``: threads of this process, side by side. ``workers=N``:
    N processes, each taking whole regions' passes, as Celery's prefork workers take the per-region tasks
    ``reconcile_all`` fans out in production. Counts statements and CPU wherever the passes ran."""

    def __init__(self, workers: int, statements: Statements, regions: list[Region]) -> None:
        self.statements, self.extra = statements, [0, 0, 0.0]  # the workers' statements, writes, CPU
        ids = [r.pk for r in regions]
        self.pool = None
        if workers:
            self.pool = ProcessPoolExecutor(
                workers, mp_context=get_context("spawn"), initializer=_worker_started, initargs=(ids,)
            )
            list(self.pool.map(time.sleep, [0.1] * workers))  # every worker started and warm
        else:
            _warm(ids)

    def run(self, regions: list[Region]) -> None:
        ids = [r.pk for r in regions]
        if self.pool is None:
            with ThreadPoolExecutor(max_workers=len(ids)) as threads:
                list(threads.map(reconcile_region, ids))
            return
        for total, writes, cpu in self.pool.map(_worker_pass, ids):
            self.extra = [self.extra[0] + total, self.extra[1] + writes, self.extra[2] + cpu]

    def read(self) -> tuple[int, int, float]:
        """Statements, writes and CPU seconds of this process and the workers so far."""
        total, writes = self.statements.read()
        return total + self.extra[0], writes + self.extra[1], time.process_time() + self.extra[2]

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


WORKER_STATEMENTS: Statements | None = None


def _worker_started(region_ids: list[int]) -> None:
    global WORKER_STATEMENTS
    WORKER_STATEMENTS = Statements()
    _warm(region_ids)


def _warm(region_ids: list[int]) -> None:
    """Build each region's driver before anything is measured, as a worker that has run a pass has them:
    the first build imports the Kubernetes client's API modules, a second or more of CPU per process."""
    for region in Region.objects.filter(pk__in=region_ids):
        driver_for(region)


def _worker_pass(region_id: int) -> tuple[int, int, float]:
    assert WORKER_STATEMENTS is not None
    total, writes = WORKER_STATEMENTS.read()
    cpu = time.process_time()
    reconcile_region(region_id)
    total_after, writes_after = WORKER_STATEMENTS.read()
    return total_after - total, writes_after - writes, time.process_time() - cpu


@dataclass
class Measured:
    seconds: float
    requests: int
    cluster_writes: int
    statements: int
    db_writes: int
    cpu: float  # the reconciler's process, seconds
    server_cpu: float


def measure(cluster: Cluster, reconcilers: Reconcilers, run: Any) -> tuple[Measured, Any]:
    requests, cluster_writes = cluster.requests()
    total, writes, cpu = reconcilers.read()
    server_cpu, start = cluster.cpu_seconds(), time.perf_counter()
    result = run()
    seconds = time.perf_counter() - start
    requests_after, cluster_writes_after = cluster.requests()
    total_after, writes_after, cpu_after = reconcilers.read()
    return Measured(
        seconds,
        requests_after - requests - 1,  # less the count request itself
        cluster_writes_after - cluster_writes,
        total_after - total,
        writes_after - writes,
        cpu_after - cpu,
        cluster.cpu_seconds() - server_cpu,
    ), result


def converge(reconcilers: Reconcilers, regions: list[Region]) -> int:
    passes = 0
    while DeploymentTarget.objects.exclude(status="ready").exists():
        DeploymentTarget.objects.exclude(status="ready").update(next_attempt_at=timezone.now())
        reconcilers.run(regions)
        passes += 1
    return passes


def row(what: str, targets: int, m: Measured, extra: str = "") -> str:
    return (
        f"{what:<9} {targets:>7} {m.seconds:>8.2f} {targets / m.seconds:>9.0f} {m.requests / targets:>8.2f} "
        f"{m.cluster_writes:>7} {m.statements / targets:>7.2f} {m.db_writes:>8} "
        f"{1000 * m.cpu / targets:>9.2f} {1000 * m.server_cpu / targets:>9.2f} {extra}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="worker processes the regions' passes run in, as Celery's prefork workers (default 0: "
        "threads of this one process)",
    )
    args = parser.parse_args()
    where = f"{args.workers} worker processes" if args.workers else "threads of one process"
    print(
        f"database: {django.db.connection.vendor}; regions: {REGIONS}, reconciled in {where}; "
        "concurrency per region: 8"
    )
    print(
        f"{'pass':<9} {'targets':>7} {'seconds':>8} {'targets/s':>9} {'req/tgt':>8} {'k-writes':>7} "
        f"{'sql/tgt':>7} {'db-writes':>8} {'cpu ms/t':>9} {'api ms/t':>9}"
    )
    statements, cluster = Statements(), Cluster()
    reconcilers = None
    try:
        with tempfile.TemporaryDirectory() as folder:
            tenant, version, regions = setup_world(cluster, Path(folder))
            reconcilers = Reconcilers(args.workers, statements, regions)
            done = 0
            for size in sorted(args.sizes):
                add_deployments(tenant, version, regions, done, size - done)
                done = size
                targets = size * REGIONS
                converged, passes = measure(cluster, reconcilers, lambda: converge(reconcilers, regions))
                print(row("converge", targets, converged, f"{passes} passes"))
                DeploymentTarget.objects.update(next_attempt_at=timezone.now())  # every target due again
                idle, _ = measure(cluster, reconcilers, lambda: reconcilers.run(regions))
                print(row("no-op", targets, idle))
    finally:
        if reconcilers is not None:
            reconcilers.stop()
        cluster.stop()


if __name__ == "__main__":
    main()
