"""Regions and deployments API: validate input → call one service → serialize output."""

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.exceptions import ValidationError as DRFValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from core import selectors as core_selectors
from core.api.conventions import idempotent
from core.api.views import ERRORS, PrincipalMixin
from core.choices import Scope
from core.errors import Conflict, ValidationFailed
from regions import selectors
from regions.api import serializers as s
from regions.drivers.base import DriverError
from regions.drivers.factory import driver_for
from regions.models import Deployment, Region
from regions.services import deployments, placement, regions
from regions.workloads import workload_spec
from registry import selectors as registry_selectors


class RegionListView(PrincipalMixin, generics.ListAPIView):
    filterset_fields = ["jurisdiction", "status", "provider"]

    def get_serializer_class(self) -> Any:
        operator = not getattr(self, "swagger_fake_view", False) and self.principal.sees_all(
            Scope.REGIONS_WRITE
        )
        return s.RegionOperatorSerializer if operator else s.RegionSerializer

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Region.objects.none()
        return selectors.regions_for(self.principal)

    @extend_schema(request=s.RegionWriteSerializer, responses={201: s.RegionOperatorSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request) -> Response:
        data = s.RegionWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        region = regions.region_create(actor=self.principal, **data.validated_data)
        return Response(s.RegionOperatorSerializer(region).data, status=201)


class RegionDetailView(PrincipalMixin):
    @extend_schema(responses={200: s.RegionSerializer, **ERRORS})
    def get(self, request: Request, code: str) -> Response:
        region = selectors.region_get(self.principal, code)
        serializer = (
            s.RegionOperatorSerializer if self.principal.sees_all(Scope.REGIONS_WRITE) else s.RegionSerializer
        )
        return Response(serializer(region).data)


class RegionStatusView(PrincipalMixin):
    @extend_schema(request=s.RegionStatusSerializer, responses={200: s.RegionSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request, code: str) -> Response:
        """Drain (no new placements), disable (stop serving) or activate a region."""
        region = selectors.region_get(self.principal, code)
        data = s.RegionStatusSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        region = regions.region_set_status(actor=self.principal, region=region, **data.validated_data)
        return Response(s.RegionSerializer(region).data)


class DeploymentListView(PrincipalMixin, generics.ListAPIView):
    serializer_class = s.DeploymentSerializer
    filterset_fields = ["state"]

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Deployment.objects.none()
        return selectors.deployments_for(self.principal)

    @extend_schema(request=s.DeploymentWriteSerializer, responses={201: s.DeploymentSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request) -> Response:
        data = s.DeploymentWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        owner = core_selectors.tenant_get(self.principal, fields.pop("owner"), None)
        model = registry_selectors.model_get(self.principal, *fields.pop("model").split("/"))
        deployment = deployments.deployment_create(actor=self.principal, owner=owner, model=model, **fields)
        return Response(s.DeploymentSerializer(deployment).data, status=201)


class DeploymentScoped(PrincipalMixin):
    def deployment(self, owner: str, name: str) -> Deployment:
        return selectors.deployment_get(self.principal, owner, name)


class DeploymentDetailView(DeploymentScoped):
    @extend_schema(responses={200: s.DeploymentSerializer, **ERRORS})
    def get(self, request: Request, owner: str, name: str) -> Response:
        return Response(s.DeploymentSerializer(self.deployment(owner, name)).data)

    @extend_schema(responses={202: s.DeploymentSerializer, **ERRORS})
    def delete(self, request: Request, owner: str, name: str) -> Response:
        deployment = deployments.deployment_delete(
            actor=self.principal, deployment=self.deployment(owner, name)
        )
        return Response(s.DeploymentSerializer(deployment).data, status=202)


class DeploymentScaleView(DeploymentScoped):
    @extend_schema(request=s.ScaleSerializer, responses={200: s.DeploymentSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request, owner: str, name: str) -> Response:
        """Set replicas per region; 0 pauses the deployment and frees its GPUs."""
        data = s.ScaleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        deployment = deployments.deployment_scale(
            actor=self.principal,
            deployment=self.deployment(owner, name),
            replicas=data.validated_data["replicas"],
        )
        return Response(s.DeploymentSerializer(deployment).data)


class DeploymentFallbacksView(DeploymentScoped):
    @extend_schema(request=s.FallbacksSerializer, responses={200: s.DeploymentSerializer, **ERRORS})
    @idempotent
    def put(self, request: Request, owner: str, name: str) -> Response:
        """Set the model names tried, in order, when this one cannot serve (docs/routing.md, fallbacks)."""
        data = s.FallbacksSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        deployment = deployments.deployment_set_fallbacks(
            actor=self.principal,
            deployment=self.deployment(owner, name),
            fallbacks=data.validated_data["fallbacks"],
        )
        return Response(s.DeploymentSerializer(deployment).data)


class DeploymentEventsView(DeploymentScoped):
    @extend_schema(responses={200: s.EventSerializer(many=True), **ERRORS})
    def get(self, request: Request, owner: str, name: str) -> Response:
        events = self.deployment(owner, name).events.select_related("region")[:500]
        return Response(s.EventSerializer(events, many=True).data)


def manifests_of(deployment: Deployment) -> dict[str, str]:
    """The rendered workload per region: Kubernetes YAML, or the engine command line for process regions.
    A region that cannot serve the version's artifact (an ``s3://`` version on a process region without
    an object store) makes it a 409 naming the region and the reason."""
    rendered = {}
    for t in deployment.targets.select_related("region").exclude(status="deleted"):
        try:
            rendered[t.region.code] = driver_for(t.region).render(workload_spec(t))
        except DriverError as exc:
            raise Conflict(
                f"No manifest for region {t.region.code}: {exc}", code="manifest_unavailable"
            ) from exc
    return rendered


class DeploymentManifestView(DeploymentScoped):
    @extend_schema(responses={200: dict})
    def get(self, request: Request, owner: str, name: str) -> Response:
        return Response(manifests_of(self.deployment(owner, name)))


def _replicas_param(raw: str) -> int:
    field = s.DeploymentWriteSerializer().fields["replicas"]
    try:
        return int(field.run_validation(raw))
    except DRFValidationError as exc:
        raise ValidationFailed(f"replicas={raw!r}: {' '.join(map(str, exc.detail))}") from exc


class PlacementView(PrincipalMixin):
    @extend_schema(
        responses={200: dict},
        parameters=[OpenApiParameter(p, str, required=True) for p in ("owner", "model", "version")]
        + [OpenApiParameter("replicas", int)],
    )
    def get(self, request: Request) -> Response:
        """Every region with whether this tenant may deploy this version there, and why not."""
        params = request.query_params
        if not all(params.get(p) for p in ("owner", "model", "version")) or "/" not in params["model"]:
            raise ValidationFailed("Give owner, model (owner/name) and version.")
        replicas = _replicas_param(params.get("replicas") or "1")
        tenant = core_selectors.tenant_get(self.principal, params["owner"], Scope.DEPLOYMENTS_READ)
        model = registry_selectors.model_get(self.principal, *params["model"].split("/", 1))
        version = registry_selectors.version_get(model, params["version"])
        preview = placement.placement_preview(tenant=tenant, version=version, replicas=replicas)
        return Response(
            {
                "gpu_type": preview.gpu_type,
                "gpu_count": preview.gpu_count,
                "regions": [
                    {
                        "code": c.region.code,
                        "jurisdiction": c.region.jurisdiction,
                        "eligible": c.eligible,
                        "reasons": c.reasons,
                        "free_gpus": c.free_gpus,
                    }
                    for c in preview.choices
                ],
            }
        )
