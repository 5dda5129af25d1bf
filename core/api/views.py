"""Platform-core API: validate input → call one service → serialize output."""

import json
from collections.abc import Callable, Iterator
from typing import Any

from django.db.models import Model, QuerySet
from django.http import StreamingHttpResponse
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core import selectors
from core.api import serializers as s
from core.api.conventions import REDACT_ATTRIBUTE, etag, expected_revision, idempotent
from core.api.filters import AuditEventFilter
from core.choices import Scope
from core.errors import NotFound, PreconditionFailed
from core.models import (
    SECRET_NAME,
    ApiToken,
    AuditEvent,
    Invitation,
    Operation,
    ServiceAccount,
    Tenant,
    TenantSecret,
    User,
)
from core.principal import Principal
from core.services import operations, secrets, tenants, tokens, users

SECRET_NOT_REPLAYED = (
    "The secret is shown only once, in the first response, and is never stored, so this replay cannot"
    " show it. If it was lost, revoke token {pk} and mint a new one."
)
ERRORS = {code: OpenApiResponse(description="Error envelope") for code in (400, 401, 403, 404, 409, 412, 422)}


class PrincipalMixin(APIView):
    @property
    def principal(self) -> Principal:
        return self.request.user  # type: ignore[return-value]

    def scoped(self, selector: Callable[[Principal], QuerySet[Any]], model: type[Model]) -> QuerySet[Any]:
        """The selector's rows for this caller; an empty queryset while the schema generator inspects us."""
        if getattr(self, "swagger_fake_view", False):
            return model._default_manager.none()
        return selector(self.principal)


def accepted(operation: Any, request: Request) -> Response:
    url = request.build_absolute_uri(reverse("api:operation-detail", args=[operation.pk]))
    body = s.OperationSerializer(operation).data
    return Response(body, status=status.HTTP_202_ACCEPTED, headers={"Location": url})


class TenantViewSet(PrincipalMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = s.TenantSerializer
    lookup_field = "slug"
    ordering_fields = ["slug", "name", "created_at"]
    filterset_fields = ["status"]

    def get_queryset(self) -> Any:
        return self.scoped(selectors.tenants_for, Tenant)

    @extend_schema(responses={200: s.TenantSerializer, **ERRORS})
    def retrieve(self, request: Request, slug: str) -> Response:
        tenant = selectors.tenant_get(self.principal, slug)
        return Response(s.TenantSerializer(tenant).data, headers={"ETag": etag(tenant.pk, tenant.revision)})

    @extend_schema(request=s.TenantWriteSerializer, responses={201: s.TenantSerializer, **ERRORS})
    @idempotent
    def create(self, request: Request) -> Response:
        data = s.TenantWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = tenants.tenant_create(actor=self.principal, **data.validated_data)
        url = reverse("api:tenant-detail", args=[tenant.slug])
        headers = {"ETag": etag(tenant.pk, tenant.revision), "Location": url}
        return Response(s.TenantSerializer(tenant).data, status=201, headers=headers)

    @extend_schema(
        request=s.TenantUpdateSerializer,
        responses={200: s.TenantSerializer, **ERRORS},
        parameters=[OpenApiParameter("If-Match", str, OpenApiParameter.HEADER, description="ETag from GET")],
    )
    def partial_update(self, request: Request, slug: str) -> Response:
        tenant = selectors.tenant_get(self.principal, slug, None)
        data = s.TenantUpdateSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        tenant = tenants.tenant_update(
            actor=self.principal,
            tenant=tenant,
            changes=dict(data.validated_data),
            expected_revision=expected_revision(request, tenant.pk),
        )
        return Response(s.TenantSerializer(tenant).data, headers={"ETag": etag(tenant.pk, tenant.revision)})


class MemberViewSet(PrincipalMixin, viewsets.ViewSet):
    """Members of one tenant: /tenants/{slug}/members/."""

    serializer_class = s.MembershipSerializer
    lookup_value_regex = r"[\w.@+-]+"

    @extend_schema(responses={200: s.MembershipSerializer(many=True), **ERRORS})
    def list(self, request: Request, tenant_slug: str) -> Response:
        tenant = selectors.tenant_get(self.principal, tenant_slug)
        members = selectors.memberships_for(self.principal, tenant)
        return Response(s.MembershipSerializer(members, many=True).data)

    @extend_schema(request=s.MembershipSetSerializer, responses={200: s.MembershipSerializer, **ERRORS})
    @idempotent
    def create(self, request: Request, tenant_slug: str) -> Response:
        tenant = selectors.tenant_get(self.principal, tenant_slug)
        data = s.MembershipSetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = tenants.membership_set_by_username(
            actor=self.principal,
            tenant=tenant,
            username=data.validated_data["username"],
            role=data.validated_data["role"],
        )
        return Response(s.MembershipSerializer(membership).data)

    @extend_schema(responses={204: None, **ERRORS})
    def destroy(self, request: Request, tenant_slug: str, pk: str) -> Response:
        tenant = selectors.tenant_get(self.principal, tenant_slug)
        membership = selectors.memberships_for(self.principal, tenant).filter(user__username=pk).first()
        if membership is None:
            raise NotFound(f"'{pk}' is not a member of {tenant.slug}.")
        tenants.membership_remove(actor=self.principal, membership=membership)
        return Response(status=204)


class SecretViewSet(PrincipalMixin, viewsets.ViewSet):
    """Secrets of one tenant: /tenants/{slug}/secrets/{name}/. Values go in (PUT) and never come out."""

    serializer_class = s.SecretSerializer
    lookup_value_regex = SECRET_NAME

    @extend_schema(responses={200: s.SecretSerializer(many=True), **ERRORS})
    def list(self, request: Request, tenant_slug: str) -> Response:
        tenant = selectors.tenant_get(self.principal, tenant_slug, None)
        return Response(s.SecretSerializer(selectors.secrets_of(self.principal, tenant), many=True).data)

    @extend_schema(responses={200: s.SecretSerializer, **ERRORS})
    def retrieve(self, request: Request, tenant_slug: str, pk: str) -> Response:
        tenant = selectors.tenant_get(self.principal, tenant_slug, None)
        return _secret_answer(selectors.secret_get(self.principal, tenant, pk))

    @extend_schema(
        request=s.SecretWriteSerializer,
        responses={200: s.SecretSerializer, 201: s.SecretSerializer, **ERRORS},
    )
    def update(self, request: Request, tenant_slug: str, pk: str) -> Response:
        """Store the secret, or replace its value (its revision moves on). ``If-Match`` (its ETag) replaces
        only the revision read; without it, whatever is there."""
        tenant = selectors.tenant_get(self.principal, tenant_slug, None)
        data = s.SecretWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        value, expected = data.validated_data["value"], _secret_match(request, self.principal, tenant, pk)
        secret, created = secrets.secret_put(
            actor=self.principal, owner=tenant, name=pk, value=value, expected_revision=expected
        )
        return _secret_answer(secret, 201 if created else 200)

    @extend_schema(responses={204: None, **ERRORS})
    def destroy(self, request: Request, tenant_slug: str, pk: str) -> Response:
        tenant = selectors.tenant_get(self.principal, tenant_slug, None)
        secret = selectors.secret_get(self.principal, tenant, pk)
        expected = expected_revision(request, secret.pk)
        secrets.secret_delete(actor=self.principal, secret=secret, expected_revision=expected)
        return Response(status=204)


def _secret_answer(secret: TenantSecret, status: int = 200) -> Response:
    return Response(
        s.SecretSerializer(secret).data, status=status, headers={"ETag": etag(secret.pk, secret.revision)}
    )


def _secret_match(request: Request, principal: Principal, tenant: Tenant, name: str) -> int | None:
    """The revision ``If-Match`` asks to replace (None: whatever is there); a secret it cannot match
    (none of that name yet) is a failed precondition."""
    current = selectors.secrets_of(principal, tenant).filter(name=name).first()
    if current is not None:
        return expected_revision(request, current.pk)
    if request.headers.get("If-Match", "").strip() not in ("", "*"):
        raise PreconditionFailed(f"There is no secret '{tenant.slug}/{name}' to match.")
    return None


class TenantInvitationViewSet(PrincipalMixin, viewsets.ViewSet):
    """Invitations of one tenant: /tenants/{slug}/invitations/ (for those who manage its members)."""

    serializer_class = s.InvitationSerializer

    @extend_schema(responses={200: s.InvitationSerializer(many=True), **ERRORS})
    def list(self, request: Request, tenant_slug: str) -> Response:
        tenant = selectors.tenant_get(self.principal, tenant_slug, None)
        found = selectors.invitations_of_tenant(self.principal, tenant)
        return Response(s.InvitationSerializer(found, many=True).data)

    @extend_schema(request=s.InvitationCreateSerializer, responses={201: s.InvitationSerializer, **ERRORS})
    @idempotent
    def create(self, request: Request, tenant_slug: str) -> Response:
        tenant = selectors.tenant_get(self.principal, tenant_slug, None)
        data = s.InvitationCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = selectors.user_by_username(data.validated_data["username"])
        invitation = tenants.invitation_create(
            actor=self.principal, tenant=tenant, user=user, role=data.validated_data["role"]
        )
        return Response(s.InvitationSerializer(invitation).data, status=201)

    @extend_schema(responses={204: None, **ERRORS})
    def destroy(self, request: Request, tenant_slug: str, pk: str) -> Response:
        """Withdraw a pending invitation."""
        tenant = selectors.tenant_get(self.principal, tenant_slug, None)
        invitation = selectors.invitation_of_tenant_get(self.principal, tenant, _int_id(pk))
        tenants.invitation_withdraw(actor=self.principal, invitation=invitation)
        return Response(status=204)


class InvitationViewSet(PrincipalMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """The invitations addressed to you: /invitations/; accept or decline them."""

    serializer_class = s.InvitationSerializer

    def get_queryset(self) -> Any:
        return self.scoped(selectors.invitations_to, Invitation)

    @extend_schema(request=None, responses={200: s.MembershipSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    @idempotent
    def accept(self, request: Request, pk: str) -> Response:
        invitation = selectors.invitation_to_get(self.principal, _int_id(pk))
        membership = tenants.invitation_accept(actor=self.principal, invitation=invitation)
        return Response(s.MembershipSerializer(membership).data)

    @extend_schema(request=None, responses={200: s.InvitationSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    @idempotent
    def decline(self, request: Request, pk: str) -> Response:
        invitation = selectors.invitation_to_get(self.principal, _int_id(pk))
        invitation = tenants.invitation_decline(actor=self.principal, invitation=invitation)
        return Response(s.InvitationSerializer(invitation).data)


def _int_id(pk: str) -> int:
    if not pk.isdigit() or len(pk) > 18:
        raise NotFound(f"No invitation {pk} for you.")
    return int(pk)


class UserViewSet(PrincipalMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = s.UserSerializer
    lookup_field = "username"
    lookup_value_regex = r"[\w.@+-]+"

    def get_queryset(self) -> Any:
        return self.scoped(selectors.users_for, User)

    @extend_schema(responses={200: s.UserSerializer, **ERRORS})
    def retrieve(self, request: Request, username: str) -> Response:
        return Response(s.UserSerializer(selectors.user_get(self.principal, username)).data)

    @extend_schema(request=s.UserCreateSerializer, responses={201: s.UserSerializer, **ERRORS})
    @idempotent
    def create(self, request: Request) -> Response:
        data = s.UserCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        slug = fields.pop("tenant", None)
        tenant = selectors.tenant_get(self.principal, slug, None) if slug else None
        user = users.user_create(actor=self.principal, tenant=tenant, **fields)
        return Response(s.UserSerializer(user).data, status=201)

    @extend_schema(request=s.UserRoleSerializer, responses={200: s.UserSerializer, **ERRORS})
    def partial_update(self, request: Request, username: str) -> Response:
        user = selectors.user_get(self.principal, username)
        data = s.UserRoleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = users.user_set_platform_role(actor=self.principal, user=user, **data.validated_data)
        return Response(s.UserSerializer(user).data)


class MeView(PrincipalMixin):
    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        p = self.principal
        return Response(
            {
                "name": p.name,
                "kind": p.kind,
                "platform_role": p.platform_role,
                # Where the caller belongs, whatever its token may read there.
                "tenants": {
                    slug: p.tenant_roles[pk]
                    for pk, slug in selectors.tenants_joined(p).values_list("pk", "slug")
                },
                "scopes": sorted(p.all_scopes),
                "token": p.token.prefix if p.token else None,
            }
        )


class ServiceAccountViewSet(
    PrincipalMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    serializer_class = s.ServiceAccountSerializer

    def get_queryset(self) -> Any:
        return self.scoped(selectors.service_accounts_for, ServiceAccount)

    @extend_schema(
        request=s.ServiceAccountCreateSerializer, responses={201: s.ServiceAccountSerializer, **ERRORS}
    )
    @idempotent
    def create(self, request: Request) -> Response:
        data = s.ServiceAccountCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        slug = fields.pop("tenant", None)
        tenant = selectors.tenant_get(self.principal, slug, None) if slug else None
        robot = tenants.service_account_create(actor=self.principal, tenant=tenant, **fields)
        return Response(s.ServiceAccountSerializer(robot).data, status=201)


class TokenViewSet(PrincipalMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = s.TokenSerializer

    def get_queryset(self) -> Any:
        return self.scoped(selectors.tokens_for, ApiToken)

    @extend_schema(responses={200: s.TokenSerializer, **ERRORS})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(s.TokenSerializer(selectors.token_get(self.principal, int(pk))).data)

    @extend_schema(request=s.TokenCreateSerializer, responses={201: s.TokenCreatedSerializer, **ERRORS})
    @idempotent
    def create(self, request: Request) -> Response:
        data = s.TokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        robot_id = fields.pop("service_account", None)
        slug = fields.pop("tenant", None)
        fields["tenant"] = selectors.tenant_get(self.principal, slug, None) if slug else None
        robot = None
        if robot_id is not None:
            robot = selectors.service_accounts_for(self.principal).filter(pk=robot_id).first()
            if robot is None:
                raise NotFound(f"No service account {robot_id}.")
        token, secret = tokens.token_create(actor=self.principal, service_account=robot, **fields)
        token.secret = secret  # type: ignore[attr-defined]
        response = Response(s.TokenCreatedSerializer(token).data, status=201)
        setattr(response, REDACT_ATTRIBUTE, {"secret": SECRET_NOT_REPLAYED.format(pk=token.pk)})
        return response

    @extend_schema(request=None, responses={200: s.TokenSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    @idempotent
    def revoke(self, request: Request, pk: str) -> Response:
        token = tokens.token_revoke(actor=self.principal, token=selectors.token_get(self.principal, int(pk)))
        return Response(s.TokenSerializer(token).data)


def _jsonl(events: Any) -> Iterator[str]:
    for event in events.iterator(chunk_size=1000):
        yield json.dumps(s.AuditEventSerializer(event).data, default=str) + "\n"


class AuditEventViewSet(PrincipalMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = s.AuditEventSerializer
    filterset_class = AuditEventFilter
    ordering_fields = ["seq", "occurred_at"]
    lookup_field = "seq"

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return AuditEvent.objects.none()
        self.principal.require_any(Scope.AUDIT_READ)
        return selectors.audit_events_for(self.principal)

    @extend_schema(responses={(200, "application/jsonl"): str}, filters=True)
    @action(detail=False, methods=["get"])
    def export(self, request: Request) -> StreamingHttpResponse:
        """The filtered events as JSON Lines, oldest first, streamed."""
        events = self.filter_queryset(self.get_queryset()).order_by("seq")
        response = StreamingHttpResponse(_jsonl(events), content_type="application/jsonl")
        response["Content-Disposition"] = 'attachment; filename="audit.jsonl"'
        return response

    @extend_schema(request=None, responses={202: s.OperationSerializer, **ERRORS})
    @action(detail=False, methods=["post"])
    @idempotent
    def verify(self, request: Request) -> Response:
        """Verify the whole hash chain in the background; poll the operation for the report."""
        self.principal.require(Scope.AUDIT_READ)
        operation = operations.operation_start(actor=self.principal, kind="audit.verify")
        return accepted(operation, request)


class OperationViewSet(PrincipalMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = s.OperationSerializer

    def get_queryset(self) -> Any:
        return self.scoped(selectors.operations_for, Operation)

    @extend_schema(responses={200: s.OperationSerializer, **ERRORS})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(s.OperationSerializer(selectors.operation_get(self.principal, pk)).data)
