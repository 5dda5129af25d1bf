"""Rollouts API: validate input → call one service → serialize output."""

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.conventions import idempotent
from core.api.views import ERRORS, PrincipalMixin
from regions import selectors as regions_selectors
from registry import selectors as registry_selectors
from rollouts import selectors
from rollouts.api import serializers as s
from rollouts.models import Rollout
from rollouts.services import rollouts


class RolloutListView(PrincipalMixin, generics.ListAPIView):
    serializer_class = s.RolloutSerializer
    filterset_fields = ["state", "strategy"]

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Rollout.objects.none()
        return selectors.rollouts_for(self.principal)

    @extend_schema(request=s.RolloutWriteSerializer, responses={202: s.RolloutSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request) -> Response:
        """Start a rollout; it runs by itself from here (202). With model and follow_alias, one rollout per
        deployment following that alias, answered as {"rollouts": [...]}."""
        data = s.RolloutWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        if "deployment" in fields:
            deployment = regions_selectors.deployment_get(
                self.principal, *fields.pop("deployment").split("/")
            )
            rollout = rollouts.rollout_start(actor=self.principal, deployment=deployment, **fields)
            return Response(s.RolloutSerializer(rollout).data, status=202)
        model = registry_selectors.model_get(self.principal, *fields.pop("model").split("/"))
        started = rollouts.rollout_start_for_alias(
            actor=self.principal, model=model, follow_alias=fields.pop("follow_alias"), **fields
        )
        return Response({"rollouts": s.RolloutSerializer(started, many=True).data}, status=202)


class RolloutScoped(PrincipalMixin):
    def rollout(self, pk: int) -> Rollout:
        return selectors.rollout_get(self.principal, pk)


class RolloutDetailView(RolloutScoped):
    @extend_schema(responses={200: s.RolloutDetailSerializer, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        return Response(s.RolloutDetailSerializer(self.rollout(pk)).data)


class RolloutActionView(RolloutScoped):
    """pause, resume, abort (reason required) and promote (to the end, by hand; reason required)."""

    action = ""

    @extend_schema(request=s.ReasonSerializer, responses={200: s.RolloutSerializer, **ERRORS})
    @idempotent
    def post(self, request: Request, pk: int) -> Response:
        data = s.ReasonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rollout, reason = self.rollout(pk), data.validated_data["reason"]
        if self.action == "pause":
            rollout = rollouts.rollout_pause(actor=self.principal, rollout=rollout, reason=reason)
        elif self.action == "resume":
            rollout = rollouts.rollout_resume(actor=self.principal, rollout=rollout)
        elif self.action == "abort":
            rollout = rollouts.rollout_abort(actor=self.principal, rollout=rollout, reason=reason)
        else:
            rollout = rollouts.rollout_promote(actor=self.principal, rollout=rollout, reason=reason)
        return Response(s.RolloutSerializer(rollout).data)
