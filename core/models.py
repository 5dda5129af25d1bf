"""The platform core: tenants, people and robots, API tokens, the audit chain and operations."""

import uuid
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from core.choices import (
    ActorType,
    AuditSource,
    InvitationStatus,
    OperationStatus,
    PlatformRole,
    Priority,
    TenantRole,
    TenantStatus,
)


class Tenant(models.Model):
    """A customer of the platform: the unit of isolation, residency policy, quota and budget.

    ``residency`` lists the jurisdictions (``choices.Jurisdiction``) where the tenant's data may be
    processed and stored; routing and placement never leave it. ``revision`` grows on every change and
    is the API's ETag, so concurrent edits are detected instead of lost.
    """

    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=TenantStatus.choices, default=TenantStatus.ACTIVE)
    home_region = models.CharField(max_length=64, blank=True)
    residency = models.JSONField(default=list)
    max_gpus = models.PositiveIntegerField(null=True, blank=True)
    monthly_budget = models.DecimalField(
        max_digits=14, decimal_places=2, null=True, blank=True, validators=[MinValueValidator(0)]
    )
    budget_currency = models.CharField(max_length=3, default="USD")
    # Enforced by the gateways: once for the whole fleet with a Redis (GATEWAY_REDIS_URL), else per process.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    concurrent_requests = models.PositiveIntegerField(null=True, blank=True)  # in flight at once
    # Budget alerts fire at these percentages of monthly_budget; a hard limit stops new requests at 100 %.
    budget_thresholds = models.JSONField(default=list, blank=True)  # percentages; empty: 50, 80, 100
    budget_hard_limit = models.BooleanField(default=False)
    # Past this percentage of monthly_budget, gateways send requests to their models' fallbacks (degrade
    # before the hard limit refuses them); null: never.
    budget_degrade_at = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(1000)]
    )
    budget_webhook = models.URLField(blank=True)
    revision = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        # A budget is compared with costs, which are kept in BILLING_CURRENCY, and no exchange rate is
        # applied: a budget in any other currency would be compared as if it were in that one.
        if self.monthly_budget is not None and self.budget_currency != settings.BILLING_CURRENCY:
            raise ValidationError(
                {
                    "budget_currency": (
                        f"Budgets are kept in {settings.BILLING_CURRENCY}, the currency of GPU prices and "
                        f"costs; convert the budget to {settings.BILLING_CURRENCY} (no exchange rates are "
                        "applied)."
                    )
                }
            )


class User(AbstractUser):
    """A person. ``platform_role`` grants power over every tenant; memberships grant it per tenant."""

    platform_role = models.CharField(max_length=16, choices=PlatformRole.choices, blank=True, default="")


class Membership(models.Model):
    """A user's role in one tenant."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=TenantRole.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant")
        ]
        ordering = ["tenant__slug", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


class Invitation(models.Model):
    """An offer to join a tenant with a role; only the invited user can accept or decline it.

    pending → accepted | declined | expired | withdrawn  (``choices.INVITATION_TRANSITIONS``)

    Tenant admins cannot add an existing user of the platform to their tenant directly (that would pull
    another tenant's person in without consent); they invite, and the membership is created when the
    invited user accepts before ``expires_at``.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="invitations")
    role = models.CharField(max_length=16, choices=TenantRole.choices)
    status = models.CharField(
        max_length=16, choices=InvitationStatus.choices, default=InvitationStatus.PENDING
    )
    invited_by_name = models.CharField(max_length=200)
    # Who invited, so an invitation dies with its inviter's right to add members (None: a robot or system).
    invited_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    responded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "user"],
                condition=models.Q(status="pending"),
                name="invitation_one_pending_per_user_tenant",
            )
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.user} to {self.tenant} as {self.role} ({self.status})"


class ServiceAccount(models.Model):
    """A robot (a CI pipeline, a gateway): of one tenant with a tenant role, or platform-wide."""

    name = models.SlugField(max_length=50)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="robots")
    role = models.CharField(max_length=16)
    description = models.CharField(max_length=500, blank=True)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    # A gateway's account (platform robots only): the regions its gateways serve. What only gateways get
    # (tenants' secrets, indexes) then goes to it only for tenants whose residency allows them all,
    # whatever regions its gateways declare. Empty: a global gateway's, or not a gateway's.
    regions = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="robot_unique_name_per_tenant"),
            models.UniqueConstraint(
                fields=["name"], condition=models.Q(tenant__isnull=True), name="robot_unique_platform_name"
            ),
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}" if self.tenant else f"platform/{self.name}"


SECRET_NAME = r"[a-z][a-z0-9-]{0,62}"  # how a secret is named, and referred to by pipelines
REGION_CODE = r"[a-z][a-z0-9-]{1,40}"  # how a region is named (regions.models.Region.code)


class TenantSecret(models.Model):
    """A tenant's secret (an API key its pipelines' ``http`` stages send to its own services), referred to
    by name everywhere. Only sealed (core/sealing.py: AES-GCM, bound to the tenant and the name) is it
    stored; its value is never shown again, only its revision, which moves on every change."""

    owner = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=63, validators=[RegexValidator(f"^{SECRET_NAME}$")])
    sealed = models.BinaryField()
    revision = models.PositiveIntegerField(default=1)
    updated_by_name = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="secret_unique_name_per_tenant")
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.owner.slug}/{self.name}"


class ApiToken(models.Model):
    """A bearer token for a user or a service account.

    ``tenant`` binds the token to one tenant: it acts only there, and it is the one tenant the gateway
    serves it for. A tenant robot's tokens are bound to the robot's tenant; a person's token is bound
    when created with a tenant (a ``models:invoke`` token always is). An unbound token acts wherever
    its owner has a role and is not valid at the gateway.

    Only the SHA-256 of the token is stored: the secret has 256 bits of entropy, so a fast hash is as
    safe as a slow one and keeps authentication a single indexed lookup. ``prefix`` is the visible part
    (``cpt_<prefix>_...``) that identifies a token in logs without revealing it.
    """

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(User, null=True, blank=True, on_delete=models.CASCADE, related_name="tokens")
    service_account = models.ForeignKey(
        ServiceAccount, null=True, blank=True, on_delete=models.CASCADE, related_name="tokens"
    )
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="tokens")
    scopes = models.JSONField(default=list)
    # The class of its requests at the gateway; a request may ask for a lower one (x-priority), never higher.
    priority = models.CharField(max_length=16, choices=Priority.choices, default=Priority.INTERACTIVE)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by_name = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False, service_account__isnull=True)
                | models.Q(user__isnull=True, service_account__isnull=False),
                name="token_has_exactly_one_owner",
            )
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"cpt_{self.prefix}_… ({self.name})"

    @property
    def owner_name(self) -> str:
        return self.user.username if self.user else str(self.service_account)

    def is_usable(self, now: datetime | None = None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class AuditEvent(models.Model):
    """One change to the platform, linked into a hash chain.

    ``hash`` is SHA-256 over a canonical serialisation of the event including ``prev_hash``, so editing,
    deleting or reordering any event breaks every later link (``services.audit.verify_chain``). Which
    columns the hash covers is fixed per ``hash_version`` (``services.audit.HASHED_FIELDS``): events
    written before version 2 do not cover ``tenant_id`` and are cross-checked against ``tenant_slug``. On
    PostgreSQL a trigger makes the table append-only. Actor and tenant names are frozen copies, so the
    record stays readable after the user or robot is gone.
    """

    seq = models.PositiveBigIntegerField(unique=True)
    occurred_at = models.DateTimeField()
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor_id = models.CharField(max_length=64, blank=True)
    actor_name = models.CharField(max_length=200)
    token_prefix = models.CharField(max_length=16, blank=True)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    tenant_slug = models.CharField(max_length=50, blank=True)
    action = models.CharField(max_length=100, db_index=True)
    target_type = models.CharField(max_length=100, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    target_repr = models.CharField(max_length=300, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    source = models.CharField(max_length=16, choices=AuditSource.choices)
    message = models.TextField(blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)
    # No default: the one writer (services.audit.audit_record) states the format it hashed with.
    hash_version = models.PositiveSmallIntegerField()

    class Meta:
        ordering = ["-seq"]
        indexes = [
            models.Index(fields=["tenant", "-seq"], name="audit_tenant_seq"),
            models.Index(fields=["target_type", "target_id"], name="audit_target"),
            models.Index(fields=["occurred_at"], name="audit_time"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.action} by {self.actor_name}"


class AuditChainHead(models.Model):
    """The single row every audit writer locks, so parallel writers extend the chain one at a time."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    seq = models.PositiveBigIntegerField(default=0)
    hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"head at #{self.seq}"


class IdempotencyRecord(models.Model):
    """The stored answer to a POST sent with an ``Idempotency-Key``, replayed for retries.

    A key belongs to the credential that sent it (``principal_key``: the token, or the session's user)
    and to one endpoint (method and path). ``response_body`` never holds a secret (the API redacts it
    before storing), and ``required_checks`` lists the permission checks the first request passed, which
    a replay must pass again.
    """

    key = models.CharField(max_length=200)
    principal_key = models.CharField(max_length=100)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=500)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    response_body = models.JSONField(null=True)
    response_headers = models.JSONField(default=dict)
    required_checks = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["principal_key", "method", "path", "key"],
                name="idempotency_unique_key_per_credential_endpoint",
            )
        ]

    def __str__(self) -> str:
        return f"{self.method} {self.path} [{self.key}]"


class Operation(models.Model):
    """A long-running action started through the API (202 Accepted), polled for progress and result.

    pending → running → succeeded | failed  (and pending → failed when it cannot start)
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=OperationStatus.choices, default=OperationStatus.PENDING)
    progress = models.PositiveSmallIntegerField(default=0)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="operations"
    )
    created_by_name = models.CharField(max_length=200)
    created_by_key = models.CharField(max_length=100, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    params = models.JSONField(default=dict)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # While running: its worker renews this; past it, the worker is taken for dead and the operation failed.
    lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"


class Lease(models.Model):
    """Leader election through the database: the process named in ``holder`` is the one active instance
    of ``name`` (the routing loop, the beat scheduler) until ``expires_at``; it renews before then, and any
    other process may take it once it has passed (``core.services.leases``)."""

    name = models.CharField(max_length=64, unique=True)
    holder = models.CharField(max_length=200)
    acquired_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name}: {self.holder} until {self.expires_at:%H:%M:%S}"
