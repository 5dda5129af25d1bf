"""Billing API: usage ingestion and tracing, prices, cost reports (JSON or CSV), idle GPUs, budget alerts."""

import csv
import io
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from billing import reports, selectors, services
from billing.api.serializers import PriceInputSerializer, PriceSerializer, UsageSerializer
from billing.crosscheck import crosscheck
from core.api.views import ERRORS, PrincipalMixin
from core.errors import ValidationFailed
from regions import selectors as region_selectors

USAGE_LIST_LIMIT = 100


class UsageIngestView(PrincipalMixin):
    @extend_schema(
        parameters=[OpenApiParameter("client_request_id", str, description="the client's X-Request-ID")],
        responses={200: UsageSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        """The newest 100 usage records the caller may see, optionally those sent with one X-Request-ID."""
        found = selectors.usage_list(self.principal, request.query_params.get("client_request_id"))
        return Response(UsageSerializer(found[:USAGE_LIST_LIMIT], many=True).data)

    @extend_schema(request=dict, responses={200: dict, **ERRORS})
    def post(self, request: Request) -> Response:
        """A gateway's batch ``{"records": [...]}``; re-sending a batch is safe (keyed by request id)."""
        data = request.data if isinstance(request.data, dict) else {}
        counts = services.usage_ingest(actor=self.principal, records=data.get("records"))  # type: ignore[arg-type]
        return Response(counts)


class UsageTraceView(PrincipalMixin):
    @extend_schema(responses={200: UsageSerializer, **ERRORS})
    def get(self, request: Request, request_id: str) -> Response:
        return Response(UsageSerializer(selectors.usage_get(self.principal, request_id)).data)


class PriceListView(PrincipalMixin):
    @extend_schema(responses={200: PriceSerializer(many=True)})
    def get(self, request: Request) -> Response:
        """Every price with its history (anyone who may read costs)."""
        return Response(PriceSerializer(selectors.prices_list(self.principal), many=True).data)

    @extend_schema(request=PriceInputSerializer, responses={201: PriceSerializer, **ERRORS})
    def post(self, request: Request) -> Response:
        data = PriceInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        region = region_selectors.region_get(self.principal, fields.pop("region"))
        price = services.price_set(actor=self.principal, region=region, **fields)
        return Response(PriceSerializer(price).data, status=201)


def _period(request: Request) -> str:
    period = request.query_params.get("month") or timezone.now().strftime("%Y-%m")
    try:
        reports.month_bounds(period)
    except ValueError as exc:
        raise ValidationFailed("month must look like 2026-11.") from exc
    return period


def _group_by(request: Request) -> list[str]:
    chosen = [g for g in request.query_params.get("group_by", "tenant,region").split(",") if g]
    unknown = set(chosen) - set(reports.GROUPS)
    if unknown or not chosen:
        raise ValidationFailed(f"group_by takes {', '.join(reports.GROUPS)} (comma-separated).")
    return chosen


class CostReportView(PrincipalMixin):
    @extend_schema(
        responses={200: dict, (200, "text/csv"): str, **ERRORS},
        parameters=[
            OpenApiParameter("month", str, description="YYYY-MM; this month when absent"),
            OpenApiParameter("group_by", str, description="comma-separated: " + ", ".join(reports.GROUPS)),
            OpenApiParameter("export", str, enum=["csv"]),
        ],
    )
    def get(self, request: Request) -> Response:
        """``?month=2026-11&group_by=tenant,region,version,day[&export=csv]``: GPU cost attributed to
        tenants (operators also see idle capacity and the evaluation line of shadow rollouts, tenant
        ``(evaluation)``), tokens, cost per 1M tokens, the hosted-API price. Mirrored requests are no
        tenant's. ``group_by=tenant,pipeline,stage`` splits a tenant's cost over its pipelines' stages
        (``(direct)``: requests outside any pipeline)."""
        period, group_by = _period(request), _group_by(request)
        tenants = selectors.cost_tenants(self.principal)
        start, end = reports.month_bounds(period)
        now = timezone.now()
        report = reports.build(start, min(end, now), now=now)
        rows = reports.summarize(report, group_by, tenants)
        if request.query_params.get("export") == "csv":
            return _csv(rows, f"costs-{period}.csv")  # type: ignore[return-value]
        total = sum((r["cost"] for r in rows), Decimal(0))
        body = {"month": period, "currency": settings.BILLING_CURRENCY, "total": total, "rows": rows}
        if tenants is None:  # operators: the platform's own cost of shadow rollouts, also among the rows
            body["evaluation"] = reports.evaluation(report)
        return Response(_exact(body))


def _exact(value: Any) -> Any:
    """Money as strings: JSON numbers would turn Decimals into floats."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {k: _exact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_exact(v) for v in value]
    return value


def _csv(rows: list[dict[str, Any]], name: str) -> HttpResponse:
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


class IdleView(PrincipalMixin):
    @extend_schema(responses={200: dict, **ERRORS}, parameters=[OpenApiParameter("hours", int)])
    def get(self, request: Request) -> Response:
        """Deployments under the idle threshold over the last ``?hours=24``, with the monthly saving."""
        try:
            hours = int(request.query_params.get("hours", 24))
        except ValueError as exc:
            raise ValidationFailed("hours must be a whole number.") from exc
        if not 1 <= hours <= 24 * 31:
            raise ValidationFailed("hours must be between 1 and 744.")
        now = timezone.now()
        report = reports.build(now - timedelta(hours=hours), now, now=now)
        threshold = Decimal(settings.BILLING_IDLE_UTILIZATION)
        found = reports.idle_deployments(report, threshold, selectors.cost_tenants(self.principal))
        return Response(_exact({"hours": hours, "threshold": threshold, "deployments": found}))


class CrosscheckView(PrincipalMixin):
    @extend_schema(
        responses={200: dict, **ERRORS},
        parameters=[OpenApiParameter("region", str, required=True), OpenApiParameter("minutes", int)],
    )
    def get(self, request: Request) -> Response:
        """``?region=eu-west-1&minutes=60``: gateway-recorded tokens against vLLM's counters (operators)."""
        region = region_selectors.region_get(self.principal, request.query_params.get("region", ""))
        try:
            minutes = int(request.query_params.get("minutes", 60))
        except ValueError as exc:
            raise ValidationFailed("minutes must be a whole number.") from exc
        return Response(crosscheck(self.principal, region, max(1, min(minutes, 24 * 60))))


class BudgetAlertView(PrincipalMixin):
    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        alerts = selectors.budget_alerts(self.principal)[:200]
        return Response(
            _exact(
                [
                    {
                        "tenant": a.tenant.slug,
                        "period": a.period,
                        "threshold": a.threshold,
                        "spent": a.spent,
                        "budget": a.budget,
                        "fired_at": a.fired_at,
                    }
                    for a in alerts
                ]
            )
        )
