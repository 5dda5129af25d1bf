"""Input and output shapes of the platform-core API. Inputs are strict: unknown fields are errors."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.conventions import StrictCharField, StrictSerializer
from core.choices import ALL_SCOPES, Jurisdiction, PlatformRole, Priority, TenantRole, TenantStatus
from core.models import (
    ApiToken,
    AuditEvent,
    Invitation,
    Membership,
    Operation,
    ServiceAccount,
    Tenant,
    TenantSecret,
    User,
)
from core.services.tenants import TENANT_FIELDS


@extend_schema_field(
    {"anyOf": [{"type": "string", "format": "uri"}, {"type": "string", "maxLength": 0}]},
)
class URLOrBlankField(serializers.URLField):
    """A URL, or "" for none: the schema says so, as the API has always answered "" when unset."""


class TenantSerializer(serializers.ModelSerializer):
    budget_webhook = URLOrBlankField(read_only=True)

    class Meta:
        model = Tenant
        fields = [*TENANT_FIELDS, "revision", "created_at", "updated_at"]
        read_only_fields = fields


class TenantWriteSerializer(StrictSerializer):
    slug = serializers.SlugField(max_length=50)
    name = serializers.CharField(max_length=200)
    residency = serializers.ListField(child=serializers.ChoiceField(Jurisdiction.choices), allow_empty=False)
    status = serializers.ChoiceField(TenantStatus.choices, required=False)
    home_region = serializers.CharField(max_length=64, required=False, allow_blank=True)
    max_gpus = serializers.IntegerField(min_value=0, max_value=100000, required=False, allow_null=True)
    monthly_budget = serializers.DecimalField(
        max_digits=14, decimal_places=2, min_value=0, required=False, allow_null=True
    )
    budget_currency = serializers.RegexField(r"^[A-Z]{3}$", required=False)
    budget_thresholds = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=1000), required=False, max_length=10
    )
    budget_hard_limit = serializers.BooleanField(required=False)
    budget_degrade_at = serializers.IntegerField(min_value=1, max_value=1000, required=False, allow_null=True)
    budget_webhook = URLOrBlankField(required=False, allow_blank=True)
    requests_per_minute = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    tokens_per_minute = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    concurrent_requests = serializers.IntegerField(
        min_value=1, max_value=1_000_000, required=False, allow_null=True
    )


class TenantUpdateSerializer(TenantWriteSerializer):
    slug = None  # type: ignore[assignment]


class UserSerializer(serializers.ModelSerializer):
    class Meta:
        model = User
        fields = ["username", "email", "platform_role", "is_active", "date_joined"]
        read_only_fields = fields


class UserCreateSerializer(StrictSerializer):
    username = serializers.RegexField(r"^[\w.@+-]{1,150}$", max_length=150)
    email = serializers.EmailField(required=False, allow_blank=True)
    password = serializers.CharField(required=False, write_only=True, max_length=128)
    platform_role = serializers.ChoiceField(PlatformRole.choices, required=False, allow_blank=True)
    tenant = serializers.SlugField(
        max_length=50, required=False, help_text="Create the user as a member of this tenant (tenant admins)"
    )
    role = serializers.ChoiceField(TenantRole.choices, required=False, help_text="Their role in `tenant`")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("tenant" in attrs) != ("role" in attrs):
            raise serializers.ValidationError({"role": ["Give tenant and role together."]})
        return attrs


class UserRoleSerializer(StrictSerializer):
    platform_role = serializers.ChoiceField(PlatformRole.choices, allow_blank=True)


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    tenant = serializers.CharField(source="tenant.slug", read_only=True)

    class Meta:
        model = Membership
        fields = ["tenant", "username", "role", "created_at"]
        read_only_fields = fields


class MembershipSetSerializer(StrictSerializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(TenantRole.choices)


class SecretSerializer(serializers.ModelSerializer):
    """A secret as anyone may read it: never its value."""

    tenant = serializers.CharField(source="owner.slug", read_only=True)

    class Meta:
        model = TenantSecret
        fields = ["tenant", "name", "revision", "updated_by_name", "created_at", "updated_at"]
        read_only_fields = fields


class SecretWriteSerializer(StrictSerializer):
    value = StrictCharField(max_length=4096, trim_whitespace=False, write_only=True)


class InvitationSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", read_only=True)
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Invitation
        fields = [
            "id",
            "tenant",
            "username",
            "role",
            "status",
            "invited_by_name",
            "created_at",
            "expires_at",
            "responded_at",
        ]
        read_only_fields = fields


class InvitationCreateSerializer(StrictSerializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(TenantRole.choices)


class ServiceAccountSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", read_only=True, allow_null=True, default=None)

    class Meta:
        model = ServiceAccount
        fields = ["id", "name", "tenant", "role", "description", "regions", "is_active", "created_at"]
        read_only_fields = fields


class ServiceAccountCreateSerializer(StrictSerializer):
    name = serializers.SlugField(max_length=50)
    tenant = serializers.SlugField(max_length=50, required=False, allow_null=True)
    role = serializers.CharField(max_length=16)
    description = serializers.CharField(max_length=500, required=False, allow_blank=True)
    regions = serializers.ListField(
        child=serializers.CharField(max_length=41),
        required=False,
        max_length=64,
        help_text="a gateway's account: the regions its gateways serve",
    )


class TokenSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner_name", read_only=True)
    tenant = serializers.SerializerMethodField()
    display = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "display",
            "prefix",
            "owner",
            "tenant",
            "scopes",
            "priority",
            "expires_at",
            "last_used_at",
            "revoked_at",
            "created_by_name",
            "created_at",
        ]
        read_only_fields = fields

    def get_tenant(self, token: ApiToken) -> str | None:
        """The tenant the token is bound to (None: unbound, not valid at the gateway)."""
        return token.tenant.slug if token.tenant else None

    def get_display(self, token: ApiToken) -> str:
        return f"cpt_{token.prefix}_…"


class TokenCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)
    scopes = serializers.ListField(child=serializers.ChoiceField(sorted(ALL_SCOPES)), allow_empty=False)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    service_account = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    tenant = serializers.SlugField(
        max_length=50, required=False, help_text="Bind the token to this tenant (required with models:invoke)"
    )
    priority = serializers.ChoiceField(
        Priority.choices,
        required=False,
        help_text="The class of its requests at the gateway: batch is shed first when a model is saturated",
    )


class TokenCreatedSerializer(TokenSerializer):
    secret = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class AuditEventSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant_slug", read_only=True)
    target = serializers.SerializerMethodField()

    class Meta:
        model = AuditEvent
        fields = [
            "seq",
            "occurred_at",
            "actor_type",
            "actor_name",
            "token_prefix",
            "tenant",
            "action",
            "target",
            "before",
            "after",
            "request_id",
            "source",
            "message",
            "prev_hash",
            "hash",
        ]
        read_only_fields = fields

    def get_target(self, event: AuditEvent) -> dict[str, Any]:
        return {"type": event.target_type, "id": event.target_id, "repr": event.target_repr}


class OperationSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Operation
        fields = [
            "id",
            "kind",
            "status",
            "progress",
            "tenant",
            "created_by_name",
            "request_id",
            "params",
            "result",
            "error",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields
