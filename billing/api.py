"""Usage API: gateways send batches; people trace a request id to region, deployment, version, checksum."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from billing import selectors, services
from billing.models import UsageRecord
from controlplane.api.views import ERRORS, PrincipalMixin


class UsageSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug")
    deployment = serializers.CharField(source="deployment.name", default=None)

    class Meta:
        model = UsageRecord
        exclude = ["id"]


class UsageIngestView(PrincipalMixin):
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
