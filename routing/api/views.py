"""Routing API: the route table (whole and per tenant) for gateways and people, exports, health, what-if,
and the activation gateways ask for when they hold requests for a deployment at zero."""

import math
import re
from collections.abc import Mapping
from typing import Any

import yaml
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from core import selectors as core_selectors
from core.api.conventions import idempotent
from core.api.views import ERRORS, PrincipalMixin
from core.choices import Scope
from core.errors import ValidationFailed
from core.models import REGION_CODE
from core.principal import Principal
from gateway import contract
from regions.models import Region
from routing import activation, exports, selectors, services
from routing.api.serializers import (
    ActivationResultSerializer,
    ActivationSerializer,
    EndpointHealthSerializer,
    ResponseCacheSerializer,
    ResponseCacheSetSerializer,
    RoutingEventSerializer,
)

LONG_POLL = [
    OpenApiParameter("wait", float, description="seconds to wait for a newer table (at most 30)"),
    OpenApiParameter("If-None-Match", str, OpenApiParameter.HEADER, description="ETag you hold"),
]


def _wait(request: Request) -> float:
    """Seconds to long-poll; NaN and infinity are refused (a NaN deadline never passes)."""
    try:
        wait = float(request.query_params.get("wait", 0))
    except ValueError:
        wait = math.nan
    if not math.isfinite(wait):
        raise ValidationFailed("wait must be a number of seconds (at most 30).")
    return wait


GATEWAY_REGION = re.compile(REGION_CODE)


def _if_none_match(request: Request) -> str:
    return request.headers.get("If-None-Match", "").strip().removeprefix("W/").strip('"')


def _conditional(request: Request, etag: str, body: Mapping[str, Any]) -> Response:
    if _if_none_match(request) == etag:
        return Response(status=304, headers={"ETag": f'"{etag}"'})
    return Response(body, headers={"ETag": f'"{etag}"'})


class RouteTableView(PrincipalMixin):
    @extend_schema(responses={200: dict, 304: None, **ERRORS}, parameters=LONG_POLL)
    def get(self, request: Request) -> Response:
        """The route table as this caller may see it (operators: all tenants). ``?wait=25`` long-polls for
        a generation newer than the one named in ``If-None-Match``."""
        table = services.table_after(_if_none_match(request), _wait(request))
        tenants = selectors.tenants_view(self.principal, table.body.get("tenants", {}))
        body = {"generation": table.generation, "created_at": table.created_at, "tenants": tenants}
        return _conditional(request, table.etag, body)


class GatewayConfigView(PrincipalMixin):
    @extend_schema(responses={200: dict, 304: None, **ERRORS}, parameters=LONG_POLL)
    def get(self, request: Request) -> Response:
        """Everything a gateway needs: every tenant's routes with the engines' API keys and the secrets
        its pipelines' http stages send, and the token digests (``gateway:sync``)."""
        self.principal.require_gateway()
        regions = _gateway_regions(request, self.principal)
        secrets = request.query_params.get("secrets") != "none"
        # The engines' keys and the tenants' secrets are in this answer only (not in the table stored or
        # shown): its ETag names their keys' generation too, so a new root key reaches every gateway.
        keys = selectors.secret_keys_tag()
        held, _, tag = _if_none_match(request).rpartition("-")
        table = services.table_after(held if tag == keys else "", _wait(request))
        etag = f"{table.etag}-{keys}"
        if _if_none_match(request) == etag:  # nothing new: nothing to build
            return Response(status=304, headers={"ETag": f'"{etag}"'})
        config: contract.GatewayConfig = {
            "generation": table.generation,
            "etag": etag,
            "table": selectors.for_gateways(table.body, regions, secrets),
        }
        return _conditional(request, etag, config)


class GatewayIndexView(PrincipalMixin):
    @extend_schema(responses={200: dict, **ERRORS})
    def get(self, request: Request, tenant: str, name: str) -> Response:
        """A tenant's retrieval index as gateways search it: its documents with their vectors
        (``gateway:sync``; the route table names each index's revision)."""
        self.principal.require_gateway()
        index = selectors.index_for_gateways(tenant, name, _gateway_regions(request, self.principal))
        return Response(index)


class NginxExportView(PrincipalMixin):
    @extend_schema(responses={(200, "text/plain"): str})
    def get(self, request: Request) -> Response:
        """The caller's routes as nginx upstream blocks (for a gateway of your own)."""
        table = services.table_after("", 0)
        text = exports.nginx(
            selectors.tenants_view(self.principal, table.body.get("tenants", {})), table.generation
        )
        return HttpResponse(text, content_type="text/plain; charset=utf-8")  # type: ignore[return-value]


class EnvoyExportView(PrincipalMixin):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "region", str, description="the region whose in-cluster Service names to include"
            )
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request) -> Response:
        """The caller's routes as Envoy v3 clusters, a priority level per tier (for an Envoy of your own)."""
        region = _region_param(request, required=False)
        table = services.table_after("", 0)
        mine = selectors.tenants_view(self.principal, table.body.get("tenants", {}))
        return Response(exports.envoy(mine, table.generation, region))


class GatewayApiExportView(PrincipalMixin):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "region", str, required=True, description="the region whose cluster they are for"
            ),
            OpenApiParameter("gateway", str, description="the Gateway the routes attach to (llm-gateway)"),
            OpenApiParameter("namespace", str, description="the routes' namespace (default)"),
            OpenApiParameter(
                "inference_pools",
                bool,
                description="1: the cluster runs the Gateway API Inference Extension",
            ),
        ],
        responses={(200, "application/yaml"): str},
    )
    def get(self, request: Request) -> Response:
        """The caller's routes as Kubernetes Gateway API HTTPRoutes (YAML, one document per route), and with
        ``inference_pools=1`` the InferencePools behind them."""
        gateway = _dns_name(request.query_params.get("gateway", "llm-gateway"), "gateway")
        namespace = _dns_name(request.query_params.get("namespace", "default"), "namespace")
        region = _region_param(request, required=True)
        table = services.table_after("", 0)
        mine = selectors.tenants_view(self.principal, table.body.get("tenants", {}))
        pools = request.query_params.get("inference_pools", "0")
        if pools not in ("0", "1"):
            raise ValidationFailed("inference_pools is 1 (the cluster runs the Inference Extension) or 0.")
        documents = exports.gateway_api(mine, table.generation, gateway, namespace, region, pools == "1")
        text = yaml.safe_dump_all(documents, sort_keys=False)
        return HttpResponse(text, content_type="application/yaml; charset=utf-8")  # type: ignore[return-value]


def _gateway_regions(request: Request, principal: Principal) -> frozenset[str]:
    """The regions the calling gateway serves: those its service account is bound to, and those it
    declares (``?regions=a,b``, its GATEWAY_REGIONS); none at all: a global gateway. The tenants' data it
    gets (secrets, indexes) is only that of tenants whose residency allows them all; a code no region has
    (one renamed or removed) is inside no tenant's residency, so it gets none."""
    bound = frozenset(principal.service_account.regions if principal.service_account else [])
    given = request.query_params.getlist("regions")
    if not given:
        return bound
    listed = given[0].split(",")
    codes = frozenset(listed)
    # Given at all, it is one list of valid codes: ",,," or a second regions= is no "every region".
    if len(given) > 1 or len(listed) > 64 or not all(GATEWAY_REGION.fullmatch(code) for code in codes):
        raise ValidationFailed(
            "regions must list the regions this gateway serves (at most 64), comma-separated.",
            detail={"regions": ["Invalid."]},
        )
    return codes | bound


def _region_param(request: Request, *, required: bool) -> str:
    """The region (cluster) an export is for: in-cluster Service names resolve only there."""
    code = request.query_params.get("region", "")
    if not code and not required:
        return ""
    if not Region.objects.filter(code=code).exists():
        raise ValidationFailed(
            "region must name the region whose cluster the export is for "
            "(Service names resolve only inside their own cluster).",
            detail={"region": ["Unknown or missing."]},
        )
    return code


def _dns_name(value: str, field: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", value):
        raise ValidationFailed(f"{field} must be a Kubernetes name (lower-case letters, digits, '-').")
    return value


class HealthView(PrincipalMixin):
    @extend_schema(responses={200: EndpointHealthSerializer(many=True)})
    def get(self, request: Request) -> Response:
        return Response(EndpointHealthSerializer(selectors.endpoint_health(self.principal), many=True).data)


class EventsView(PrincipalMixin):
    @extend_schema(responses={200: RoutingEventSerializer(many=True)})
    def get(self, request: Request) -> Response:
        """The failover timeline, newest first (at most 200)."""
        return Response(
            RoutingEventSerializer(selectors.routing_events(self.principal)[:200], many=True).data
        )


class WhatIfView(PrincipalMixin):
    @extend_schema(
        responses={200: dict, **ERRORS}, parameters=[OpenApiParameter("region", str, required=True)]
    )
    def get(self, request: Request) -> Response:
        """``?region=eu-west-1``: which tenants and models lose service or capacity if that region fails."""
        code = request.query_params.get("region", "")
        if not Region.objects.filter(code=code).exists():
            raise ValidationFailed(f"Unknown region {code!r}; pass ?region=<code>.")
        return Response({"region": code, "impact": selectors.what_if(self.principal, code)})


class ActivationView(PrincipalMixin):
    @extend_schema(request=ActivationSerializer, responses={202: ActivationResultSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request) -> Response:
        """A gateway holds requests for a route at zero (``gateway:sync``): wake the region the published
        route table offers as ``activatable`` to one replica. Calling again while it starts changes
        nothing (``woke`` false); a route that is served, or unavailable for another reason, is 409
        ``not_activatable``."""
        self.principal.require(Scope.GATEWAY_SYNC)
        data = ActivationSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        woken = activation.activate(**data.validated_data, now=timezone.now())
        return Response(ActivationResultSerializer(woken).data, status=202)


class ResponseCacheListView(PrincipalMixin):
    @extend_schema(responses={200: ResponseCacheSerializer(many=True)})
    def get(self, request: Request) -> Response:
        """The response-cache opt-ins of the tenants the caller sees (docs/routing.md, response cache)."""
        return Response(ResponseCacheSerializer(selectors.response_caches(self.principal), many=True).data)


class ResponseCacheView(PrincipalMixin):
    def _target(self, slug: str) -> Any:
        return core_selectors.tenant_get(self.principal, slug, None)  # 404 for another tenant's slug

    @extend_schema(request=ResponseCacheSetSerializer, responses={200: ResponseCacheSerializer, **ERRORS})
    def put(self, request: Request, tenant: str, model: str) -> Response:
        """Cache this tenant's deterministic requests to ``model`` for ``ttl_seconds`` (opt in or change)."""
        target = self._target(tenant)
        data = ResponseCacheSetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        policy = services.response_cache_set(
            actor=self.principal, tenant=target, model_name=model, **data.validated_data
        )
        return Response(ResponseCacheSerializer(policy).data)

    @extend_schema(responses={204: None, **ERRORS})
    def delete(self, request: Request, tenant: str, model: str) -> Response:
        """Opt out: the gateways stop caching and delete the tenant's entries for ``model``."""
        services.response_cache_clear(actor=self.principal, tenant=self._target(tenant), model_name=model)
        return Response(status=204)
