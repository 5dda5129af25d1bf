"""Every status, role, scope and code the platform core uses, and what each role may do."""

from django.db import models


class Jurisdiction(models.TextChoices):
    """Legal areas data may be processed and stored in (ISO-3166 alpha-2, plus EU as a bloc)."""

    EU = "EU", "European Union"
    US = "US", "United States"
    UK = "UK", "United Kingdom"
    CH = "CH", "Switzerland"
    JP = "JP", "Japan"
    CA = "CA", "Canada"
    AU = "AU", "Australia"
    SG = "SG", "Singapore"
    IN = "IN", "India"
    BR = "BR", "Brazil"
    KR = "KR", "South Korea"


class TenantStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    SUSPENDED = "suspended", "Suspended"


class PlatformRole(models.TextChoices):
    NONE = "", "None"
    ADMIN = "admin", "Platform admin"
    OPERATOR = "operator", "Operator"
    AUDITOR = "auditor", "Auditor"


class Priority(models.TextChoices):
    """A request's class at the gateway when a model is saturated: batch is shed first, so interactive
    traffic keeps its latency. The values are the wire's (gateway/contract.py PRIORITIES)."""

    INTERACTIVE = "interactive", "Interactive"
    BATCH = "batch", "Batch (shed first under load)"


class TenantRole(models.TextChoices):
    ADMIN = "admin", "Tenant admin"
    DEVELOPER = "developer", "Developer"
    VIEWER = "viewer", "Viewer"


class Scope(models.TextChoices):
    """What a token may be used for. A token's power is its scopes intersected with its owner's role."""

    TENANTS_READ = "tenants:read", "Read tenants and members"
    TENANTS_WRITE = "tenants:write", "Create and change tenants"
    MEMBERS_WRITE = "members:write", "Manage tenant members and service accounts"
    USERS_WRITE = "users:write", "Create users and set platform roles"
    TOKENS_WRITE = "tokens:write", "Create and revoke service-account tokens"
    AUDIT_READ = "audit:read", "Read the audit log"
    REGISTRY_READ = "registry:read", "Read the model registry"
    REGISTRY_WRITE = "registry:write", "Register models, versions and validation reports"
    REGISTRY_PROMOTE = "registry:promote", "Move versions through the lifecycle and move aliases"
    DEPLOYMENTS_READ = "deployments:read", "Read regions and deployments"
    DEPLOYMENTS_WRITE = "deployments:write", "Create, scale and delete deployments"
    REGIONS_WRITE = "regions:write", "Manage regions, drain and disable them"
    BILLING_READ = "billing:read", "Read costs and budgets"
    BILLING_WRITE = "billing:write", "Manage prices and budgets"
    MODELS_INVOKE = "models:invoke", "Call the tenant's models through the gateway"
    SECRETS_WRITE = "secrets:write", "Store, rotate and delete the tenant's secrets (values are write-only)"
    GATEWAY_SYNC = "gateway:sync", "Fetch the gateway configuration (routes, token digests) and send usage"


ALL_SCOPES = frozenset(Scope.values)
READ_SCOPES = frozenset(s for s in Scope.values if s.endswith(":read"))
# Scopes that only make sense across the platform; a tenant role never grants them.
PLATFORM_ONLY_SCOPES = frozenset(
    {Scope.USERS_WRITE, Scope.REGIONS_WRITE, Scope.BILLING_WRITE, Scope.TENANTS_WRITE, Scope.GATEWAY_SYNC}
)

PLATFORM_ROLE_SCOPES: dict[str, frozenset[str]] = {
    PlatformRole.NONE: frozenset(),
    PlatformRole.ADMIN: ALL_SCOPES,
    PlatformRole.OPERATOR: ALL_SCOPES
    - {Scope.USERS_WRITE, Scope.TENANTS_WRITE, Scope.MEMBERS_WRITE, Scope.GATEWAY_SYNC},
    PlatformRole.AUDITOR: READ_SCOPES,
}

TENANT_ROLE_SCOPES: dict[str, frozenset[str]] = {
    TenantRole.ADMIN: ALL_SCOPES - PLATFORM_ONLY_SCOPES,
    TenantRole.DEVELOPER: frozenset(
        {
            Scope.TENANTS_READ,
            Scope.REGISTRY_READ,
            Scope.REGISTRY_WRITE,
            Scope.REGISTRY_PROMOTE,
            Scope.DEPLOYMENTS_READ,
            Scope.DEPLOYMENTS_WRITE,
            Scope.BILLING_READ,
            Scope.MODELS_INVOKE,
            Scope.SECRETS_WRITE,
        }
    ),
    TenantRole.VIEWER: frozenset(
        {Scope.TENANTS_READ, Scope.REGISTRY_READ, Scope.DEPLOYMENTS_READ, Scope.BILLING_READ}
    ),
}


class InvitationStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    ACCEPTED = "accepted", "Accepted"
    DECLINED = "declined", "Declined"
    EXPIRED = "expired", "Expired"
    WITHDRAWN = "withdrawn", "Withdrawn"


INVITATION_TRANSITIONS: dict[str, set[str]] = {
    InvitationStatus.PENDING: {
        InvitationStatus.ACCEPTED,
        InvitationStatus.DECLINED,
        InvitationStatus.EXPIRED,
        InvitationStatus.WITHDRAWN,
    },
    InvitationStatus.ACCEPTED: set(),
    InvitationStatus.DECLINED: set(),
    InvitationStatus.EXPIRED: set(),
    InvitationStatus.WITHDRAWN: set(),
}


class ActorType(models.TextChoices):
    USER = "user", "User"
    SERVICE_ACCOUNT = "service_account", "Service account"
    SYSTEM = "system", "System"


class AuditSource(models.TextChoices):
    API = "api", "API"
    DASHBOARD = "dashboard", "Dashboard"
    TASK = "task", "Task"
    COMMAND = "command", "Command"
    SYSTEM = "system", "System"


class OperationStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


OPERATION_TRANSITIONS: dict[str, set[str]] = {
    OperationStatus.PENDING: {OperationStatus.RUNNING, OperationStatus.FAILED},
    OperationStatus.RUNNING: {OperationStatus.SUCCEEDED, OperationStatus.FAILED},
    OperationStatus.SUCCEEDED: set(),
    OperationStatus.FAILED: set(),
}
OPERATION_FINAL_STATES = frozenset({OperationStatus.SUCCEEDED, OperationStatus.FAILED})
