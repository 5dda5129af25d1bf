"""The monthly cost report from millions of usage rows on PostgreSQL: time and query plan, 1M then 10M.

Uses its own database (created if missing, dropped at the end unless --keep): the demo world, one
deployment in each of the three demo regions with a month of GPU time, and usage rows spread over the
month, inserted by PostgreSQL itself (generate_series).

    .venv/bin/python bench/cost_report_bench.py [--millions 1,10]
    (DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/controlplane_bench)
"""

import argparse
import os
import sys
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/controlplane_bench")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("select 1 from pg_database where datname = %s", [name]).fetchone():
            conn.execute(f'create database "{name}"')


def world(month_start):  # type: ignore[no-untyped-def]
    from django.core.management import call_command

    from billing.models import CapacitySegment, GpuPrice
    from core.choices import AuditSource
    from core.models import Tenant
    from core.principal import Principal
    from regions.models import Deployment, Region
    from regions.services.deployments import deployment_create
    from registry.models import RegisteredModel

    call_command("migrate", verbosity=0)
    call_command("seed_demo", verbosity=0)
    actor = Principal.system("bench", source=AuditSource.COMMAND)
    model = RegisteredModel.objects.get(name="tiny-llama", owner=None)
    deployments = []
    for code, tenant in (("eu-west-1", "acme-eu"), ("eu-central-1", "acme-eu"), ("us-east-1", "globex-us")):
        name = f"bench-{code}"
        found = Deployment.objects.filter(name=name).first() or deployment_create(
            actor=actor,
            owner=Tenant.objects.get(slug=tenant),
            name=name,
            model=model,
            version="1.0.0",
            regions=[code],
        )
        deployments.append(found)
        region = Region.objects.get(code=code)
        GpuPrice.objects.get_or_create(
            region=region,
            gpu_type=found.gpu_type,
            pricing_model="on_demand",
            effective_from=month_start,
            defaults={"hourly_price": Decimal("0.80")},
        )
        CapacitySegment.objects.get_or_create(
            deployment=found,
            region=region,
            defaults={
                "version": found.version,
                "gpu_type": found.gpu_type,
                "gpus": 1,
                "started_at": month_start,
                "ended_at": month_start + timedelta(days=30),
            },
        )
    return deployments


def insert_usage(count: int, offset: int, month_start, deployments, pipeline_every: int = 0) -> float:  # type: ignore[no-untyped-def]
    from django.db import connection

    rows = [(d.pk, d.owner_id, d.targets.get().region.code) for d in deployments]
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            insert into billing_usagerecord (request_id, tenant_id, model_name, region, deployment_id,
                version, artifact_sha256, endpoint, status, prompt_tokens, completion_tokens, latency_ms,
                attempts, stream, started_at, hour, received_at, client_request_id, track,
                candidate_errors, degraded, served_model_name, trace_id, pipeline, stage)
            select 'bench-' || n, (%(tenants)s::bigint[])[1 + n %% 3], 'chat',
                   (%(regions)s::text[])[1 + n %% 3],
                   (%(deployments)s::bigint[])[1 + n %% 3], 'tiny-llama@1.0.0', '', '', 200,
                   50 + n %% 200, 10 + n %% 300, 12.5, 1, false,
                   %(start)s::timestamptz + (n %% 2592000) * interval '1 second',
                   date_trunc('hour', %(start)s::timestamptz + (n %% 2592000) * interval '1 second'), now(),
                   '', 'stable', 0, '', '', '',
                   case when %(every)s > 0 and n %% %(every)s = 0
                        then 'acme-eu/support-rag@1.0.0' else '' end,
                   case when %(every)s > 0 and n %% %(every)s = 0
                        then (array['embed', 'rerank', 'answer'])[1 + (n / %(every)s) %% 3] else '' end
            from generate_series(%(first)s, %(last)s) as n
            """,
            {
                "tenants": [r[1] for r in rows],
                "regions": [r[2] for r in rows],
                "deployments": [r[0] for r in rows],
                "start": month_start,
                "first": offset + 1,
                "last": offset + count,
                "every": pipeline_every,  # 1 record in N is a pipeline's stage (0: none)
            },
        )
        cursor.execute("analyze billing_usagerecord")
    return time.perf_counter() - started


def report(month_start):  # type: ignore[no-untyped-def]
    from billing import reports

    started = time.perf_counter()
    built = reports.build(month_start, month_start + timedelta(days=30))
    rows = reports.summarize(built, ["tenant", "region", "version", "day"], None)
    return time.perf_counter() - started, rows


def plan(month_start) -> str:  # type: ignore[no-untyped-def]
    from django.db import connection, transaction

    from billing.reports import usage_query

    sql, params = usage_query(month_start, month_start + timedelta(days=30)).query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off; SET LOCAL work_mem = '64MB'")  # as the report runs it
        cursor.execute(f"explain (analyze, buffers off, timing off) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--millions", default="1,10", help="row counts to measure, in millions, ascending")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database")
    parser.add_argument(
        "--pipeline-every", type=int, default=0, help="make 1 usage record in N a pipeline stage's (0: none)"
    )
    args = parser.parse_args()
    url = os.environ["DATABASE_URL"]
    ensure_database(url)
    import django

    django.setup()
    from django.utils import timezone

    from billing.models import UsageRecord

    month_start = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0) - timedelta(
        days=40
    )
    month_start = month_start.replace(day=1)
    deployments = world(month_start)
    UsageRecord.objects.filter(request_id__startswith="bench-").delete()
    have = 0
    for millions in [int(m) for m in args.millions.split(",")]:
        target = millions * 1_000_000
        took = insert_usage(target - have, have, month_start, deployments, args.pipeline_every)
        have = target
        print(f"inserted up to {have:,} usage rows in {took:.1f} s", flush=True)
        seconds, rows = report(month_start)
        again, _ = report(month_start)
        print(
            f"{have:>12,} rows: monthly report {seconds:.2f} s (again {again:.2f} s), {len(rows)} report rows"
        )
    print("\nplan of the usage aggregation at the largest size:\n" + plan(month_start))
    if not args.keep:
        from django.db import connections

        connections.close_all()
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f'drop database "{name}"')


if __name__ == "__main__":
    main()
