"""Reconciler benchmark against a Kubernetes API test server speaking the real REST protocol.

For N deployments × 5 regions it measures (1) convergence from empty: passes of the reconciler until every
(deployment, region) is ready, and (2) a no-op pass: everything due again, nothing changed, which must
issue no writes to the clusters. Run by hand (it prints figures; it is not a test):

    .venv/bin/python bench/reconcile_bench.py --sizes 100 1000
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cp_bench .venv/bin/python bench/reconcile_bench.py

It uses a throw-away SQLite database in a temporary folder unless DATABASE_URL is set (the database is
flushed). Deployments are inserted directly (admission is not what is measured here).
"""

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="cp-bench-"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("LOG_LEVEL", "ERROR")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402

from core.models import Tenant  # noqa: E402
from core.principal import Principal  # noqa: E402
from regions.models import Deployment, DeploymentTarget, Region  # noqa: E402
from regions.reconciler import reconcile_region  # noqa: E402
from regions.services.regions import region_create  # noqa: E402
from registry.models import ModelVersion, RegisteredModel  # noqa: E402
from tests.support.kube_api import KubeApiServer  # noqa: E402

REGIONS = 5


def setup_world(server: KubeApiServer, folder: Path) -> tuple[Tenant, ModelVersion, list[Region]]:
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    actor = Principal.system("bench")
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(json.dumps(server.kubeconfig()))
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


def reconcile_everything(regions: list[Region]) -> None:
    with ThreadPoolExecutor(max_workers=len(regions)) as pool:  # regions reconcile side by side
        list(pool.map(lambda r: reconcile_region(r.pk), regions))


def converge(regions: list[Region]) -> tuple[float, int]:
    start, passes = time.perf_counter(), 0
    while DeploymentTarget.objects.exclude(status="ready").exists():
        DeploymentTarget.objects.exclude(status="ready").update(next_attempt_at=timezone.now())
        reconcile_everything(regions)
        passes += 1
    return time.perf_counter() - start, passes


def noop_pass(server: KubeApiServer, regions: list[Region]) -> tuple[float, int, int]:
    DeploymentTarget.objects.update(next_attempt_at=timezone.now())
    server.state.requests.clear()
    start = time.perf_counter()
    reconcile_everything(regions)
    return time.perf_counter() - start, len(server.state.requests), len(server.state.writes())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    args = parser.parse_args()
    print(f"database: {django.db.connection.vendor}; regions: {REGIONS}; concurrency per region: 8")
    print(
        f"{'deployments':>11} {'targets':>8} {'converge s':>10} {'passes':>6} {'targets/s':>9} "
        f"{'no-op s':>8} {'requests':>8} {'writes':>6}"
    )
    with KubeApiServer() as server, tempfile.TemporaryDirectory() as folder:
        tenant, version, regions = setup_world(server, Path(folder))
        done = 0
        for size in sorted(args.sizes):
            add_deployments(tenant, version, regions, done, size - done)
            done = size
            seconds, passes = converge(regions)
            noop_seconds, requests, writes = noop_pass(server, regions)
            targets = size * REGIONS
            print(
                f"{size:>11} {targets:>8} {seconds:>10.2f} {passes:>6} {targets / seconds:>9.0f} "
                f"{noop_seconds:>8.2f} {requests:>8} {writes:>6}"
            )


if __name__ == "__main__":
    main()
