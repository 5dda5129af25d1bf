"""Autoscaling API: a deployment's policy (PUT replaces, DELETE stops autoscaling), its scaling state, and
its decision log. Each call is one service or selector."""

from typing import Any

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response

from autoscaling import selectors
from autoscaling.api import serializers as s
from autoscaling.models import ScalingDecision
from autoscaling.services import policies
from core.api.conventions import idempotent
from core.api.views import ERRORS, PrincipalMixin
from regions import selectors as regions_selectors
from regions.models import Deployment


def scaling_body(principal: Any, deployment: Deployment) -> dict[str, Any]:
    found = selectors.scaling_of(principal, deployment)
    found["capacity_limited"] = selectors.capacity_limited(deployment)
    return s.ScalingSerializer(found).data  # type: ignore[no-any-return]


class AutoscalingView(PrincipalMixin):
    def deployment(self, owner: str, name: str) -> Deployment:
        return regions_selectors.deployment_get(self.principal, owner, name)

    @extend_schema(responses={200: s.ScalingSerializer, **ERRORS})
    def get(self, request: Request, owner: str, name: str) -> Response:
        """The policy (null when there is none), each region's replicas, signals and limits, the last
        50 decisions."""
        return Response(scaling_body(self.principal, self.deployment(owner, name)))

    @extend_schema(request=s.PolicyWriteSerializer, responses={200: s.ScalingSerializer, **ERRORS})
    @idempotent
    def put(self, request: Request, owner: str, name: str) -> Response:
        """Create or replace the policy; fields left out take their defaults. 400 names the bad field."""
        deployment = self.deployment(owner, name)
        policies.policy_set(actor=self.principal, deployment=deployment, body=request.data)
        return Response(scaling_body(self.principal, deployment))

    @extend_schema(responses={204: None, **ERRORS})
    def delete(self, request: Request, owner: str, name: str) -> Response:
        """Stop autoscaling; the replicas stay as they are."""
        policies.policy_delete(actor=self.principal, deployment=self.deployment(owner, name))
        return Response(status=204)


class DecisionFilter(django_filters.FilterSet):
    # A plain number, not a choice among every deployment: which ids exist is nobody else's business.
    deployment = django_filters.NumberFilter(field_name="deployment_id", min_value=1, max_value=2**63 - 1)

    class Meta:
        model = ScalingDecision
        fields = ["kind", "deployment"]


class DecisionListView(PrincipalMixin, generics.ListAPIView):
    """Every scaling decision of the caller's deployments, newest first (filter by deployment id or kind)."""

    serializer_class = s.DecisionListSerializer
    filterset_class = DecisionFilter

    def get_queryset(self) -> Any:
        return self.scoped(selectors.decisions_for, ScalingDecision)
