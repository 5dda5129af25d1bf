"""Cost reports from the database: capacity segments × prices, usage per hour, attribution, idle GPUs, and
the platform's evaluation line (rollouts' shadow candidates and the requests mirrored to them).

The usage side is one GROUP BY over usage records per (deployment, region, tenant, version, hour, track,
pipeline, stage), which is what the 10-million-row benchmark measures (bench/cost_report_bench.py).
"""

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from billing.choices import UsageTrack
from billing.costing import (
    EVALUATION,
    IDLE,
    NO_STAGE,
    Price,
    PriceBook,
    Segment,
    Stage,
    attribute,
    round_region_hour,
    segment_costs,
    stage_shares,
)
from billing.models import CapacitySegment, GpuPrice, UsageRecord
from core.models import Tenant
from regions.choices import TargetPurpose
from regions.models import GpuPool, Region

MONTH_HOURS = Decimal(730)


@dataclass
class Line:
    """One row of the finest grain: (tenant, region, deployment, version, hour, pipeline, stage)."""

    tenant: str  # "" for idle capacity, EVALUATION for rollouts' evaluation capacity and mirrored requests
    region: str
    deployment: str
    version: str
    hour: datetime
    pipeline: str = ""  # the pipeline version whose stage this is; "" outside any pipeline
    stage: str = ""
    cost: Decimal = Decimal(0)
    gpu_hours: Decimal = Decimal(0)
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_requests: int = 0  # of ``requests``, answered by the gateways' response cache (no GPU ran)


@dataclass
class Report:
    start: datetime
    end: datetime
    currency: str
    lines: list[Line] = field(default_factory=list)
    utilization: dict[tuple[str, str], Decimal] = field(default_factory=dict)  # (deployment, region)
    # (deployment, region) → (hours it held GPUs inside the window, its unrounded GPU cost there)
    held: dict[tuple[str, str], tuple[Decimal, Decimal]] = field(default_factory=dict)


def _segments(start: datetime, end: datetime, now: datetime) -> tuple[list[Segment], dict[int, Any]]:
    pools = {(p.region_id, p.gpu_type): p.pricing_model for p in GpuPool.objects.all()}
    rows = (
        CapacitySegment.objects.filter(started_at__lt=end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=start))
        .select_related("deployment__owner", "deployment__model", "version__model", "region")
    )
    segments, about = [], {}
    for row in rows:
        about[row.pk] = row
        segments.append(
            Segment(
                key=row.pk,  # the capacity segment: it carries deployment and version
                region=row.region.code,
                gpu_type=row.gpu_type,
                pricing_model=pools.get((row.region_id, row.gpu_type), "on_demand"),
                gpus=row.gpus,
                start=row.started_at,
                end=min(row.ended_at or now, end),
            )
        )
    return segments, about


def _prices() -> PriceBook:
    return PriceBook(
        Price(p.region.code, p.gpu_type, p.pricing_model, p.hourly_price, p.effective_from)
        for p in GpuPrice.objects.select_related("region")
    )


def prices_now(now: datetime | None = None) -> Callable[[Region, str], Decimal | None]:
    """The GPU price in force at ``now`` (default: the wall clock) per region and GPU type."""
    book, now = _prices(), now or timezone.now()
    pools = {(p.region_id, p.gpu_type): p.pricing_model for p in GpuPool.objects.all()}

    def price(region: Region, gpu_type: str) -> Decimal | None:
        found = book.at((region.code, gpu_type, pools.get((region.pk, gpu_type), "on_demand")), now)
        return found.hourly if found else None

    return price


def usage_query(start: datetime, end: datetime) -> Any:
    """Requests and tokens per (deployment, region, tenant, version, hour, track, pipeline, stage): plain
    columns, no join and no expression, so PostgreSQL can estimate the groups (the extended statistics of
    migration 0010 cover exactly these columns) and aggregate them in a hash table."""
    return (
        UsageRecord.objects.filter(started_at__gte=start, started_at__lt=end)
        .values("deployment_id", "region", "tenant_id", "version", "hour", "track", "pipeline", "stage")
        .annotate(requests=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
        .order_by()
    )


def usage_by_hour(start: datetime, end: datetime) -> list[dict[str, Any]]:
    slugs = dict(Tenant.objects.values_list("pk", "slug"))
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                # One scan of millions of rows: JIT compilation costs more than it saves here.
                cursor.execute("SET LOCAL jit = off; SET LOCAL work_mem = '64MB'")
        rows = [dict(row) for row in usage_query(start, end)]
    for row in rows:
        row["tenant__slug"] = slugs[row.pop("tenant_id")]
    return rows


def capacity_tokens(gpu_type: str, gpu_hours: Decimal) -> Decimal:
    per_gpu_hour = settings.BILLING_TOKENS_PER_GPU_HOUR
    return gpu_hours * Decimal(per_gpu_hour.get(gpu_type, per_gpu_hour["default"]))


Where = tuple[int, str, datetime]  # (deployment id, region code, hour)
StageTokens = dict[tuple[Where, str], dict[Stage, Decimal]]  # (where, tenant) → weighted tokens per stage
Costs = dict[tuple[int, str, datetime], tuple[Decimal, Decimal]]  # (segment id, region, hour) → hours, cost


def _serving(segment: CapacitySegment) -> bool:
    return segment.purpose == TargetPurpose.SERVING


def build(start: datetime, end: datetime, *, now: datetime | None = None) -> Report:
    """Every cost and usage line of [start, end): GPU cost attributed per tenant, idle and evaluation apart.

    Requests answered from the response cache are the tenant's requests and tokens, with no GPU cost: they
    do not weigh in a shared deployment's split. Mirrored requests (a shadow candidate's copies, which the
    client never saw) are no tenant's: they
    neither count as a tenant's tokens nor weigh in a shared deployment's split; they and the evaluation
    capacity they ran on make the platform's ``EVALUATION`` lines.

    Capacity still held counts up to ``now`` (default ``end``), never beyond: the caller passes the clock
    in, so a report never reads the wall clock."""
    segments, about = _segments(start, end, now or end)
    costs = segment_costs(segments, _prices(), start, end)
    usage = usage_by_hour(start, end)
    billed = [row for row in usage if row["track"] != UsageTrack.MIRROR]
    # A cached answer ran on no GPU: it weighs nothing in a shared deployment's split.
    on_gpus = [row for row in billed if row["track"] != UsageTrack.CACHE]
    tokens = _tokens(on_gpus)
    capacity = _serving_capacity(costs, about)
    weight = Decimal(str(settings.BILLING_PROMPT_TOKEN_WEIGHT))
    report = Report(start, end, settings.BILLING_CURRENCY)
    shares = _shares(costs, about, tokens, capacity, weight)
    _add_costs(report, shares, about, costs, _stage_tokens(on_gpus, weight))
    _add_usage(report, billed, about)
    _add_usage(report, [row for row in usage if row["track"] == UsageTrack.MIRROR], about, EVALUATION)
    serving = {key: value for key, value in costs.items() if _serving(about[key[0]])}
    _utilization(report, capacity, about, tokens, weight)
    _held(report, [s for s in segments if _serving(about[s.key])], about, serving)
    return report


Shares = dict[tuple[str, datetime], dict[tuple[int, str], Decimal]]  # (region, hour) → (segment, tenant)


def _shares(
    costs: Costs,
    about: dict[int, Any],
    tokens: dict[Where, dict[str, tuple[int, int]]],
    capacity: dict[Where, Decimal],
    weight: Decimal,
) -> Shares:
    """Each segment-hour's cost by tenant, unrounded: serving capacity attributed, evaluation capacity the
    platform's."""
    by_region_hour: Shares = defaultdict(dict)
    for (segment_id, region, hour), (_, cost) in costs.items():
        segment = about[segment_id]
        where = (segment.deployment_id, region, hour)
        if _serving(segment):
            deployment = segment.deployment
            used = tokens.get(where, {})
            shares = attribute(cost, deployment.owner.slug, deployment.shared, used, capacity[where], weight)
        else:
            shares = {EVALUATION: cost}
        bucket = by_region_hour[(region, hour)]
        for tenant, share in shares.items():
            bucket[(segment_id, tenant)] = bucket.get((segment_id, tenant), Decimal(0)) + share
    return by_region_hour


def _tokens(usage: list[dict[str, Any]]) -> dict[Where, dict[str, tuple[int, int]]]:
    """Billed (prompt, completion) tokens per deployment, region and hour, by tenant."""
    tokens: dict[Where, dict[str, tuple[int, int]]] = defaultdict(dict)
    for row in usage:
        where = (row["deployment_id"], row["region"], row["hour"])
        prompt, completion = tokens[where].get(row["tenant__slug"], (0, 0))
        tokens[where][row["tenant__slug"]] = (prompt + row["prompt"], completion + row["completion"])
    return tokens


def _stage_tokens(usage: list[dict[str, Any]], weight: Decimal) -> StageTokens:
    """Each tenant's weighted tokens per (pipeline, stage) in a deployment-region-hour, weighed as in the
    split between tenants: what its share of the hour's GPU cost is split over."""
    found: StageTokens = defaultdict(lambda: defaultdict(Decimal))
    for row in usage:
        where = (row["deployment_id"], row["region"], row["hour"])
        found[(where, row["tenant__slug"])][(row["pipeline"], row["stage"])] += (
            weight * row["prompt"] + row["completion"]
        )
    return found


def _serving_capacity(costs: Costs, about: dict[int, Any]) -> dict[Where, Decimal]:
    """Weighted tokens a deployment's serving GPUs could have served in a region-hour, over all its
    revisions there: during a canary the stable and the candidate segment share one hour's tokens, so each
    is judged against the pair's capacity (judging each alone would bill the tokens twice)."""
    capacity: dict[Where, Decimal] = defaultdict(Decimal)
    for (segment_id, region, hour), (gpu_hours, _) in costs.items():
        segment = about[segment_id]
        if _serving(segment):
            capacity[(segment.deployment_id, region, hour)] += capacity_tokens(segment.gpu_type, gpu_hours)
    return capacity


def _name(segment: CapacitySegment) -> str:
    return f"{segment.deployment.owner.slug}/{segment.deployment.name}"


def _add_costs(
    report: Report, by_region_hour: Shares, about: dict[int, Any], costs: Costs, stages: StageTokens
) -> None:
    """Cost lines, each region-hour rounded to cents together (conservation), then each tenant's cents
    split over the pipeline stages its tokens came from: a tenant's cents are what they were before the
    split, so the stages add up to the tenant, region and deployment totals to the cent."""
    for (region, hour), joint in by_region_hour.items():
        for (segment_id, tenant), cents in round_region_hour(joint).items():
            segment = about[segment_id]
            gpu_hours = costs[(segment_id, region, hour)][0] if tenant != IDLE else Decimal(0)
            # Idle and evaluation are no tenant's slug, so they find no tokens and stay outside pipelines.
            used = stages.get(((segment.deployment_id, region, hour), tenant), {})
            for (pipeline, stage), (cost, hours) in stage_shares(cents, gpu_hours, used).items():
                report.lines.append(
                    Line(
                        tenant=tenant,
                        region=region,
                        deployment=_name(segment),
                        version=f"{segment.version.model.name}@{segment.version.version}",
                        hour=hour,
                        pipeline=pipeline,
                        stage=stage,
                        cost=cost,
                        gpu_hours=hours,
                    )
                )


def _held(report: Report, segments: list[Segment], about: dict[int, Any], costs: Costs) -> None:
    """How long each deployment held serving GPUs in the window (the union of its segments, clipped) and
    what that cost: a deployment that exists for 7 minutes of a 24-hour window is judged on those 7
    minutes. Evaluation capacity is the platform's, so it is not the owner's to save."""
    spans: dict[tuple[str, str], list[tuple[datetime, datetime]]] = defaultdict(list)
    for segment in segments:
        lo, hi = max(segment.start, report.start), min(segment.end, report.end)
        if lo < hi:
            spans[(_name(about[segment.key]), segment.region)].append((lo, hi))
    cost: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for (segment_id, region, _), (_, amount) in costs.items():
        cost[(_name(about[segment_id]), region)] += amount
    report.held = {key: (_covered_hours(found), cost[key]) for key, found in spans.items()}


def _covered_hours(spans: list[tuple[datetime, datetime]]) -> Decimal:
    seconds, reach = 0.0, None
    for lo, hi in sorted(spans):
        if reach is not None and lo < reach:
            lo = reach
        if hi > lo:
            seconds += (hi - lo).total_seconds()
            reach = hi
    return Decimal(str(seconds)) / Decimal(3600)


def _add_usage(
    report: Report, usage: list[dict[str, Any]], about: dict[int, Any], tenant: str | None = None
) -> None:
    """Usage lines, each the tenant's own, or all under ``tenant`` (the platform's mirrored requests: the
    pipeline got the stable revision's answer, so a copy is no pipeline's, as its GPUs are no tenant's)."""
    names = {s.deployment_id: _name(s) for s in about.values()}
    for row in usage:
        pipeline, stage = (row["pipeline"], row["stage"]) if tenant is None else NO_STAGE
        report.lines.append(
            Line(
                tenant=tenant if tenant is not None else row["tenant__slug"],
                region=row["region"],
                deployment=names.get(row["deployment_id"], str(row["deployment_id"])),
                version=row["version"],
                hour=row["hour"],
                pipeline=pipeline,
                stage=stage,
                requests=row["requests"],
                prompt_tokens=row["prompt"],
                completion_tokens=row["completion"],
                cached_requests=row["requests"] if row["track"] == UsageTrack.CACHE else 0,
            )
        )


def _utilization(
    report: Report,
    capacity: dict[Where, Decimal],
    about: dict[int, Any],
    tokens: dict[Where, dict[str, tuple[int, int]]],
    weight: Decimal,
) -> None:
    """Billed weighted tokens over serving capacity per (deployment, region), across the window; each
    region-hour's tokens counted once however many segments it had."""
    names = {s.deployment_id: _name(s) for s in about.values()}
    held: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    used: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for (deployment_id, region, hour), amount in capacity.items():
        key = (names[deployment_id], region)
        held[key] += amount
        for prompt, completion in tokens.get((deployment_id, region, hour), {}).values():
            used[key] += weight * prompt + completion
    report.utilization = {k: min(Decimal(1), used[k] / v) if v else Decimal(0) for k, v in held.items()}


def spent_by_tenant(report: Report) -> dict[str, Decimal]:
    """Each tenant's GPU cost in the report (idle capacity under "")."""
    spent: dict[str, Decimal] = defaultdict(Decimal)
    for line in report.lines:
        spent[line.tenant] += line.cost
    return dict(spent)


def evaluation(report: Report) -> dict[str, Any]:
    """The platform's evaluation line: what shadow rollouts cost (their candidates' GPUs) and the requests
    mirrored to them, none of it billed to a tenant."""
    lines = [line for line in report.lines if line.tenant == EVALUATION]
    return {
        "cost": sum((line.cost for line in lines), Decimal(0)),
        "gpu_hours": sum((line.gpu_hours for line in lines), Decimal(0)).quantize(Decimal("0.001")),
        "requests": sum(line.requests for line in lines),
        "prompt_tokens": sum(line.prompt_tokens for line in lines),
        "completion_tokens": sum(line.completion_tokens for line in lines),
    }


DEFAULT_THRESHOLDS = [50, 80, 100]


def thresholds_of(tenant: Tenant) -> list[int]:
    """A tenant's alert thresholds in percent (the defaults when it chose none); 100 % always fires
    under a hard limit, since that alert is what blocks the tenant, and so does the degrade threshold."""
    chosen = sorted({int(t) for t in tenant.budget_thresholds}) or DEFAULT_THRESHOLDS
    chosen = sorted({*chosen, 100}) if tenant.budget_hard_limit else chosen
    # The degrade threshold is crossed like any other: its alert is what sends requests to fallbacks.
    return sorted({*chosen, tenant.budget_degrade_at}) if tenant.budget_degrade_at else chosen


def budget_status(tenants: Iterable[Tenant], month: Report) -> list[dict[str, Any]]:
    """Budget, month-to-date spend, share used and alert thresholds of each tenant, from the month."""
    spent = spent_by_tenant(month)
    found = []
    for tenant in tenants:
        used, limit = spent.get(tenant.slug, Decimal(0)), tenant.monthly_budget or Decimal(0)
        found.append(
            {
                "tenant": tenant.slug,
                "limit": limit,
                "currency": tenant.budget_currency,
                "spent": used.quantize(Decimal("0.01")),
                "percent": (used / limit * 100).quantize(Decimal("0.1")) if limit else None,
                "thresholds": thresholds_of(tenant),
                "hard_limit": tenant.budget_hard_limit,
            }
        )
    return found


def month_bounds(period: str) -> tuple[datetime, datetime]:
    """The month ``2026-11`` as [start, end); ValueError for anything else, 9999-12 included (its end
    is past the last representable date)."""
    start = datetime.strptime(period, "%Y-%m").replace(tzinfo=timezone.get_current_timezone())
    try:
        end = (start + timedelta(days=32)).replace(day=1)
    except OverflowError as exc:
        raise ValueError(f"{period} ends past the last representable date") from exc
    return start, end


GROUPS = ("tenant", "region", "deployment", "version", "day", "pipeline", "stage")
IDLE_LABEL = "(idle)"
DIRECT = "(direct)"  # a tenant's pipeline and stage outside any pipeline (never a pipeline's name)


def _dimensions(line: Line) -> dict[str, str]:
    """What a line shows in each dimension of GROUPS: the platform's own lines (idle, evaluation) are
    outside pipelines under their own name, so ``group_by=pipeline`` never passes idle capacity off as a
    tenant's direct requests."""
    tenant = line.tenant or IDLE_LABEL
    outside = tenant if line.tenant in (IDLE, EVALUATION) else DIRECT
    return {
        "tenant": tenant,
        "region": line.region,
        "deployment": line.deployment,
        "version": line.version,
        "day": line.hour.date().isoformat(),
        "pipeline": line.pipeline or outside,
        "stage": line.stage or outside,
    }


def summarize(report: Report, group_by: list[str], tenants: set[str] | None) -> list[dict[str, Any]]:
    """Rows grouped by the chosen dimensions; ``tenants`` limits to those (None: all, idle included)."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for line in report.lines:
        if tenants is not None and line.tenant not in tenants:
            continue
        values = _dimensions(line)
        key = tuple(values[g] for g in group_by)
        row = rows.setdefault(
            key,
            {
                **{g: values[g] for g in group_by},
                "cost": Decimal(0),
                "gpu_hours": Decimal(0),
                "requests": 0,
                "cached_requests": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
            },
        )
        row["cost"] += line.cost
        row["gpu_hours"] += line.gpu_hours
        row["requests"] += line.requests
        row["cached_requests"] += line.cached_requests
        row["prompt_tokens"] += line.prompt_tokens
        row["completion_tokens"] += line.completion_tokens
    hosted = Decimal(str(settings.BILLING_HOSTED_PRICE_PER_1M))
    for row in rows.values():
        tokens = row["prompt_tokens"] + row["completion_tokens"]
        row["gpu_hours"] = row["gpu_hours"].quantize(Decimal("0.001"))
        row["cost_per_1m_tokens"] = (
            (row["cost"] / tokens * 1_000_000).quantize(Decimal("0.0001")) if tokens else None
        )
        row["hosted_api_cost"] = (hosted * tokens / 1_000_000).quantize(Decimal("0.01"))
    return sorted(rows.values(), key=lambda r: tuple(str(r[g]) for g in group_by))


def idle_deployments(report: Report, threshold: Decimal, tenants: set[str] | None) -> list[dict[str, Any]]:
    """Deployments whose utilization over the report's window stayed under ``threshold``, with the monthly
    saving of scaling them to zero: their cost per hour of the time they actually held GPUs in the window
    (not the whole window: a deployment created 7 minutes ago is not averaged over 24 hours) × 730."""
    found = []
    for (name, region), utilization in sorted(report.utilization.items()):
        if utilization >= threshold or (tenants is not None and name.split("/")[0] not in tenants):
            continue
        hours, cost = report.held.get((name, region), (Decimal(0), Decimal(0)))
        found.append(
            {
                "deployment": name,
                "region": region,
                "utilization": utilization.quantize(Decimal("0.0001")),
                "utilization_percent": (utilization * 100).quantize(Decimal("0.1")),
                "observed_hours": hours.quantize(Decimal("0.01")),
                "monthly_saving": (cost / hours * MONTH_HOURS).quantize(Decimal("0.01"))
                if hours
                else Decimal("0.00"),
            }
        )
    return found
