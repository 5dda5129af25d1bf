"""Registry API: validate input → call one service → serialize output."""

from datetime import datetime
from typing import Any

import django_filters
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response

from core import selectors as core_selectors
from core.api.conventions import etag, expected_revision, idempotent
from core.api.parsers import utc_instant
from core.api.views import ERRORS, PrincipalMixin
from core.errors import ValidationFailed
from core.models import Tenant
from core.principal import Principal
from registry import selectors
from registry.api import serializers as s
from registry.diff import lineage, version_diff
from registry.engine_args import ENGINE_ARGS, vllm_available
from registry.models import ModelVersion, Pipeline, PipelineVersion, RegisteredModel, RetrievalIndex
from registry.services import indexes, lifecycle, models, pipelines, reports, versions


def _owner(principal: Principal, slug: str) -> Tenant | None:
    """The tenant a new model or pipeline is for (the caller must see it), or None for ``platform``."""
    return None if slug == "platform" else core_selectors.tenant_get(principal, slug, None)


class ModelScoped(PrincipalMixin):
    def model(self, owner: str, name: str) -> RegisteredModel:
        return selectors.model_get(self.principal, owner, name)

    def version(self, owner: str, name: str, version: str) -> ModelVersion:
        return selectors.version_get(self.model(owner, name), version)


class ModelFilter(django_filters.FilterSet):
    q = django_filters.CharFilter(field_name="name", lookup_expr="icontains")
    owner = django_filters.CharFilter(method="filter_owner")

    class Meta:
        model = RegisteredModel
        fields = ["task", "visibility"]

    def filter_owner(self, queryset: Any, name: str, value: str) -> Any:
        return queryset.filter(selectors.owned_by(value))


class ModelListView(ModelScoped, generics.ListAPIView):
    serializer_class = s.ModelSerializer
    filterset_class = ModelFilter
    ordering_fields = ["name", "created_at"]

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return RegisteredModel.objects.none()
        return selectors.models_for(self.principal)

    @extend_schema(request=s.ModelWriteSerializer, responses={201: s.ModelSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request) -> Response:
        data = s.ModelWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        owner_slug = fields.pop("owner")
        owner = _owner(self.principal, owner_slug)
        model = models.model_register(actor=self.principal, owner=owner, **fields)
        return Response(
            s.ModelSerializer(model).data, status=201, headers={"ETag": etag(model.pk, model.revision)}
        )


class ModelDetailView(ModelScoped):
    @extend_schema(responses={200: s.ModelSerializer, **ERRORS})
    def get(self, request: Request, owner: str, name: str) -> Response:
        model = self.model(owner, name)
        return Response(s.ModelSerializer(model).data, headers={"ETag": etag(model.pk, model.revision)})

    @extend_schema(request=s.ModelUpdateSerializer, responses={200: s.ModelSerializer, **ERRORS})
    def patch(self, request: Request, owner: str, name: str) -> Response:
        model = self.model(owner, name)
        data = s.ModelUpdateSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        model = models.model_update(
            actor=self.principal,
            model=model,
            changes=dict(data.validated_data),
            expected_revision=expected_revision(request, model.pk),
        )
        return Response(s.ModelSerializer(model).data, headers={"ETag": etag(model.pk, model.revision)})


class VersionListView(ModelScoped):
    @extend_schema(responses={200: s.VersionSerializer(many=True), **ERRORS})
    def get(self, request: Request, owner: str, name: str) -> Response:
        return Response(s.VersionSerializer(selectors.versions_of(self.model(owner, name)), many=True).data)

    @extend_schema(
        request=s.VersionWriteSerializer, responses={201: s.VersionSerializer, 200: s.VersionSerializer}
    )
    @idempotent
    def post(self, request: Request, owner: str, name: str) -> Response:
        model = self.model(owner, name)
        data = s.VersionWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        version, created = versions.version_register(actor=self.principal, model=model, **data.validated_data)
        return Response(s.VersionSerializer(version).data, status=201 if created else 200)


class VersionDetailView(ModelScoped):
    @extend_schema(responses={200: s.VersionSerializer, **ERRORS})
    def get(self, request: Request, owner: str, name: str, version: str) -> Response:
        return Response(s.VersionSerializer(self.version(owner, name, version)).data)

    @extend_schema(request=s.VersionUpdateSerializer, responses={200: s.VersionSerializer, **ERRORS})
    def patch(self, request: Request, owner: str, name: str, version: str) -> Response:
        found = self.version(owner, name, version)
        data = s.VersionUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        updated = versions.version_update(
            actor=self.principal, version=found, changes=dict(data.validated_data)
        )
        return Response(s.VersionSerializer(updated).data)


class TransitionView(ModelScoped):
    @extend_schema(responses={200: s.TransitionSerializer(many=True), **ERRORS})
    def get(self, request: Request, owner: str, name: str, version: str) -> Response:
        found = self.version(owner, name, version)
        return Response(s.TransitionSerializer(found.transitions.all(), many=True).data)

    @extend_schema(request=s.TransitionRequestSerializer, responses={200: s.VersionSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request, owner: str, name: str, version: str) -> Response:
        found = self.version(owner, name, version)
        data = s.TransitionRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        moved = lifecycle.version_transition(actor=self.principal, version=found, **data.validated_data)
        return Response(s.VersionSerializer(moved).data)


class ReportView(ModelScoped):
    @extend_schema(responses={200: s.ReportSerializer(many=True), **ERRORS})
    def get(self, request: Request, owner: str, name: str, version: str) -> Response:
        return Response(s.ReportSerializer(self.version(owner, name, version).reports.all(), many=True).data)

    @extend_schema(request=s.ReportWriteSerializer, responses={201: s.ReportSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request, owner: str, name: str, version: str) -> Response:
        found = self.version(owner, name, version)
        data = s.ReportWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        report = reports.report_submit(actor=self.principal, version=found, **data.validated_data)
        return Response(s.ReportSerializer(report).data, status=201)


class LineageView(ModelScoped):
    @extend_schema(responses={200: dict})
    def get(self, request: Request, owner: str, name: str, version: str) -> Response:
        found = self.version(owner, name, version)
        return Response(
            {
                "lineage": lineage(found),
                "transitions": s.TransitionSerializer(found.transitions.all(), many=True).data,
                "reports": s.ReportSerializer(found.reports.all(), many=True).data,
            }
        )


class DiffView(ModelScoped):
    @extend_schema(
        responses={200: dict}, parameters=[OpenApiParameter("from", str), OpenApiParameter("to", str)]
    )
    def get(self, request: Request, owner: str, name: str) -> Response:
        model = self.model(owner, name)
        a, b = request.query_params.get("from"), request.query_params.get("to")
        if not a or not b:
            raise ValidationFailed("Give the two versions to compare as ?from=<version>&to=<version>.")
        return Response(version_diff(selectors.version_get(model, a), selectors.version_get(model, b)))


class RollbackView(ModelScoped):
    @extend_schema(request=s.RollbackRequestSerializer, responses={200: s.VersionSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request, owner: str, name: str) -> Response:
        model = self.model(owner, name)
        data = s.RollbackRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        target = lifecycle.model_rollback(
            actor=self.principal, model=model, reason=data.validated_data["reason"]
        )
        return Response(s.VersionSerializer(target).data)


class AliasListView(ModelScoped):
    @extend_schema(responses={200: s.AliasSerializer(many=True), **ERRORS})
    def get(self, request: Request, owner: str, name: str) -> Response:
        model = self.model(owner, name)
        return Response(s.AliasSerializer(model.aliases.select_related("version"), many=True).data)


def _parse_at(raw: str) -> datetime:
    try:
        at = parse_datetime(raw)
    except ValueError:  # well-formed but impossible: month 13, offset +25:00
        at = None
    if at is None or at.tzinfo is None:
        raise ValidationFailed(
            f"at={raw!r} is not an ISO 8601 time with a time zone, e.g. 2026-11-03T14:00:00Z."
        )
    return utc_instant(at, "at")


class AliasDetailView(ModelScoped):
    @extend_schema(
        responses={200: s.AliasSerializer, **ERRORS},
        parameters=[OpenApiParameter("at", str, description="ISO time: where did the alias point then?")],
    )
    def get(self, request: Request, owner: str, name: str, alias: str) -> Response:
        found = selectors.alias_get(self.model(owner, name), alias)
        if "at" not in request.query_params:
            return Response(s.AliasSerializer(found).data)
        at = _parse_at(request.query_params["at"])
        then = selectors.alias_version_at(found, at)
        return Response({"name": found.name, "at": at, "version": then.version if then else None})

    @extend_schema(request=s.AliasMoveRequestSerializer, responses={200: s.AliasSerializer, **ERRORS})
    def put(self, request: Request, owner: str, name: str, alias: str) -> Response:
        model = self.model(owner, name)
        data = s.AliasMoveRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        target = data.validated_data["version"]
        version = model.versions.filter(version=target).first() if target is not None else None
        if target is not None and version is None:
            raise ValidationFailed(
                f"Alias target '{target}' is not a version of {model.ref}.",
                detail={"version": [f"No version '{target}'."]},
            )
        moved = lifecycle.alias_move(
            actor=self.principal,
            model=model,
            name=alias,
            version=version,
            reason=data.validated_data["reason"],
        )
        return Response(s.AliasSerializer(moved).data)


class AliasHistoryView(ModelScoped):
    @extend_schema(responses={200: s.AliasMoveSerializer(many=True), **ERRORS})
    def get(self, request: Request, owner: str, name: str, alias: str) -> Response:
        found = selectors.alias_get(self.model(owner, name), alias)
        moves = found.moves.select_related("version", "previous_version")
        return Response(s.AliasMoveSerializer(moves, many=True).data)


class EngineArgumentsView(PrincipalMixin):
    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        """The engine arguments versions and deployments may set, with their types and bounds."""
        return Response(
            {
                "validated_by_vllm": vllm_available(),
                "arguments": {
                    name: {
                        "type": spec.kind.__name__,
                        "help": spec.help,
                        "minimum": spec.minimum,
                        "maximum": spec.maximum,
                        "choices": list(spec.choices) or None,
                    }
                    for name, spec in sorted(ENGINE_ARGS.items())
                },
            }
        )


class PipelineScoped(PrincipalMixin):
    def pipeline(self, owner: str, name: str) -> Pipeline:
        return selectors.pipeline_get(self.principal, owner, name)

    def pipeline_version(self, owner: str, name: str, version: str) -> PipelineVersion:
        return selectors.pipeline_version_get(self.pipeline(owner, name), version)


class PipelineListView(PipelineScoped, generics.ListAPIView):
    serializer_class = s.PipelineSerializer

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Pipeline.objects.none()
        return selectors.pipelines_for(self.principal)

    @extend_schema(request=s.PipelineWriteSerializer, responses={201: s.PipelineSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request) -> Response:
        data = s.PipelineWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        owner_slug = fields.pop("owner")
        owner = _owner(self.principal, owner_slug)
        created = pipelines.pipeline_create(actor=self.principal, owner=owner, **fields)
        return Response(s.PipelineSerializer(created).data, status=201)


class PipelineDetailView(PipelineScoped):
    @extend_schema(responses={200: s.PipelineSerializer, **ERRORS})
    def get(self, request: Request, owner: str, name: str) -> Response:
        return Response(s.PipelineSerializer(self.pipeline(owner, name)).data)


class PipelineVersionListView(PipelineScoped):
    @extend_schema(responses={200: s.PipelineVersionSerializer(many=True), **ERRORS})
    def get(self, request: Request, owner: str, name: str) -> Response:
        found = self.pipeline(owner, name).versions.select_related("pipeline__owner")
        return Response(s.PipelineVersionSerializer(found, many=True).data)

    @extend_schema(
        request=s.PipelineVersionWriteSerializer, responses={201: s.PipelineVersionSerializer, **ERRORS}
    )
    @idempotent
    def post(self, request: Request, owner: str, name: str) -> Response:
        pipeline = self.pipeline(owner, name)
        data = s.PipelineVersionWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        created = pipelines.pipeline_version_create(
            actor=self.principal, pipeline=pipeline, **data.validated_data
        )
        return Response(s.PipelineVersionSerializer(created).data, status=201)


class PipelineVersionDetailView(PipelineScoped):
    @extend_schema(responses={200: s.PipelineVersionSerializer, **ERRORS})
    def get(self, request: Request, owner: str, name: str, version: str) -> Response:
        return Response(s.PipelineVersionSerializer(self.pipeline_version(owner, name, version)).data)

    @extend_schema(request=s.PipelineGraphSerializer, responses={200: s.PipelineVersionSerializer, **ERRORS})
    def patch(self, request: Request, owner: str, name: str, version: str) -> Response:
        found = self.pipeline_version(owner, name, version)
        data = s.PipelineGraphSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        updated = pipelines.pipeline_version_update(
            actor=self.principal, version=found, graph=data.validated_data["graph"]
        )
        return Response(s.PipelineVersionSerializer(updated).data)


class PipelineTransitionView(PipelineScoped):
    @extend_schema(
        request=s.PipelineTransitionSerializer, responses={200: s.PipelineVersionSerializer, **ERRORS}
    )
    @idempotent
    def post(self, request: Request, owner: str, name: str, version: str) -> Response:
        found = self.pipeline_version(owner, name, version)
        data = s.PipelineTransitionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        moved = pipelines.pipeline_version_transition(
            actor=self.principal, version=found, **data.validated_data
        )
        return Response(s.PipelineVersionSerializer(moved).data)


class IndexListView(PrincipalMixin, generics.ListAPIView):
    serializer_class = s.IndexSerializer

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return RetrievalIndex.objects.none()
        return selectors.indexes_for(self.principal)

    @extend_schema(request=s.IndexWriteSerializer, responses={201: s.IndexSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request) -> Response:
        data = s.IndexWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        owner = core_selectors.tenant_get(self.principal, fields.pop("owner"), None)
        created = indexes.index_create(actor=self.principal, owner=owner, **fields)
        return Response(s.IndexSerializer(created).data, status=201)


class IndexDetailView(PrincipalMixin):
    @extend_schema(responses={200: s.IndexSerializer, **ERRORS})
    def get(self, request: Request, owner: str, name: str) -> Response:
        return Response(s.IndexSerializer(selectors.index_get(self.principal, owner, name)).data)


class IndexDocumentsView(PrincipalMixin):
    @extend_schema(responses={200: dict, **ERRORS})
    def get(self, request: Request, owner: str, name: str) -> Response:
        """The index's documents (keys and texts; vectors are not listed)."""
        index = selectors.index_get(self.principal, owner, name)
        return Response(
            {"revision": index.revision, "documents": list(index.documents.values("key", "text"))}
        )

    @extend_schema(request=s.DocumentsWriteSerializer, responses={200: dict, **ERRORS})
    def put(self, request: Request, owner: str, name: str) -> Response:
        """Add or replace documents by key, all or none."""
        index = selectors.index_get(self.principal, owner, name)
        data = s.DocumentsWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        documents = [dict(d) for d in data.validated_data["documents"]]
        revision = indexes.documents_put(actor=self.principal, index=index, documents=documents)
        return Response({"revision": revision, "documents": index.documents.count()})


class IndexDocumentView(PrincipalMixin):
    @extend_schema(responses={204: None, **ERRORS})
    def delete(self, request: Request, owner: str, name: str, key: str) -> Response:
        index = selectors.index_get(self.principal, owner, name)
        indexes.document_delete(actor=self.principal, index=index, key=key)
        return Response(status=204)
