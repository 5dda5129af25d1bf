"""Artifact replicas API: the versions × regions matrix, copy-ahead requests, retries, storage used."""

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response

from artifacts import selectors
from artifacts.api import serializers as s
from artifacts.models import ArtifactReplica
from artifacts.services import scheduling
from core.api.conventions import idempotent
from core.api.views import ERRORS, PrincipalMixin
from core.choices import Scope
from regions import selectors as region_selectors
from registry import selectors as registry_selectors


class ReplicaListView(PrincipalMixin, generics.ListAPIView):
    serializer_class = s.ReplicaSerializer
    filterset_fields = ["state", "region__code"]

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return ArtifactReplica.objects.none()
        return selectors.replicas_for(self.principal)

    @extend_schema(request=s.ReplicaRequestSerializer, responses={202: s.ReplicaSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request) -> Response:
        """Copy a version's weights into a region ahead of deployments."""
        data = s.ReplicaRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        model = registry_selectors.model_get(self.principal, *data.validated_data["model"].split("/"))
        version = registry_selectors.version_get(model, data.validated_data["version"])
        region = region_selectors.region_get(self.principal, data.validated_data["region"])
        replica = scheduling.replica_request(actor=self.principal, version=version, region=region)
        return Response(s.ReplicaSerializer(replica).data, status=202)


class ReplicaRetryView(PrincipalMixin):
    @extend_schema(request=None, responses={202: s.ReplicaSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request, pk: int) -> Response:
        replica = scheduling.replica_retry(
            actor=self.principal, replica=selectors.replica_get(self.principal, pk)
        )
        return Response(s.ReplicaSerializer(replica).data, status=202)


class ReplicaMatrixView(PrincipalMixin):
    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        grid = selectors.matrix(selectors.replicas_for(self.principal))
        rows = [
            {
                "version": row["version"],
                "cells": {code: s.ReplicaSerializer(replica).data for code, replica in row["cells"].items()},
            }
            for row in grid["rows"]
        ]  # type: ignore[attr-defined]
        return Response({"regions": grid["regions"], "rows": rows})


class StorageView(PrincipalMixin):
    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        """Bytes of model weights held in each region's object store (operators)."""
        self.principal.require(Scope.REGIONS_WRITE)
        return Response(selectors.storage_used(self.principal))
