"""The costs page: month-to-date cost by tenant, region and version, a daily chart stacked by region,
cost per 1M tokens against a hosted API, idle GPUs and budget alerts."""

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from billing import reports, selectors
from core.principal import Principal
from core.views import page

COLORS = ["#2563eb", "#16a34a", "#d97706", "#9333ea", "#dc2626", "#0891b2"]
CHART_HEIGHT = 160


def _chart(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Daily cost stacked by region, as SVG rectangles computed here (no chart library, no CDN)."""
    days = sorted({r["day"] for r in rows})
    regions = sorted({r["region"] for r in rows})
    color = {region: COLORS[i % len(COLORS)] for i, region in enumerate(regions)}
    per_day = {day: [r for r in rows if r["day"] == day] for day in days}
    peak = max(
        (sum((r["cost"] for r in found), Decimal(0)) for found in per_day.values()), default=Decimal(0)
    )
    bars = []
    for index, day in enumerate(days):
        y = Decimal(CHART_HEIGHT)
        for row in sorted(per_day[day], key=lambda r: r["region"]):
            height = (row["cost"] / peak * CHART_HEIGHT) if peak else Decimal(0)
            y -= height
            bars.append(
                {
                    "x": 40 + index * 22,
                    "y": float(y),
                    "height": float(height),
                    "color": color[row["region"]],
                    "label": f"{day} {row['region']}: {row['cost']}",
                }
            )
    labels = [{"x": 40 + i * 22, "text": day[8:]} for i, day in enumerate(days)]  # day of the month
    return {
        "bars": bars,
        "legend": color,
        "peak": peak,
        "width": max(400, 60 + len(days) * 22),
        "labels": labels,
    }


@page
def costs(request: HttpRequest, p: Principal) -> HttpResponse:
    tenants = selectors.cost_tenants(p)
    period = request.GET.get("month") or timezone.now().strftime("%Y-%m")
    try:
        start, end = reports.month_bounds(period)
    except ValueError:
        period = timezone.now().strftime("%Y-%m")
        start, end = reports.month_bounds(period)
    now = timezone.now()
    report = reports.build(start, min(end, now), now=now)
    day = reports.build(now - timedelta(hours=24), now, now=now)
    this_month = now.strftime("%Y-%m")
    month = (
        report if period == this_month else reports.build(reports.month_bounds(this_month)[0], now, now=now)
    )
    context = {
        "period": period,
        "currency": settings.BILLING_CURRENCY,
        "by_tenant": reports.summarize(report, ["tenant", "region", "version"], tenants),
        "chart": _chart(reports.summarize(report, ["day", "region"], tenants)),
        "total": sum(
            (line.cost for line in report.lines if tenants is None or line.tenant in tenants), Decimal(0)
        ),
        "idle": reports.idle_deployments(day, Decimal(settings.BILLING_IDLE_UTILIZATION), tenants),
        "alerts": selectors.budget_alerts(p).filter(period=period),
        "hosted_price": settings.BILLING_HOSTED_PRICE_PER_1M,
        "budget_month": this_month,
        "budgets": reports.budget_status(selectors.budget_tenants(p), month),
    }
    return render(request, "billing/costs.html", context)
