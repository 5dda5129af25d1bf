"""A demo world: an EU tenant and a US tenant, each with an admin, plus platform staff. Safe to re-run."""

from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from controlplane.choices import AuditSource, PlatformRole, TenantRole
from controlplane.models import Tenant, User
from controlplane.principal import Principal
from controlplane.services.tenants import membership_set, tenant_create
from controlplane.services.users import user_create

DEMO_PASSWORD = "inference-demo-2026"
TENANTS: list[dict[str, Any]] = [
    {
        "slug": "acme-eu",
        "name": "Acme Europe",
        "residency": ["EU", "CH"],
        "home_region": "eu-west-1",
        "max_gpus": 16,
        "monthly_budget": "25000.00",
        "budget_currency": "EUR",
    },
    {
        "slug": "globex-us",
        "name": "Globex US",
        "residency": ["US"],
        "home_region": "us-east-1",
        "max_gpus": 32,
        "monthly_budget": "40000.00",
        "budget_currency": "USD",
    },
]
USERS = [
    ("admin", PlatformRole.ADMIN, None),
    ("operator", PlatformRole.OPERATOR, None),
    ("auditor", PlatformRole.AUDITOR, None),
    ("eu-admin", PlatformRole.NONE, ("acme-eu", TenantRole.ADMIN)),
    ("eu-dev", PlatformRole.NONE, ("acme-eu", TenantRole.DEVELOPER)),
    ("us-admin", PlatformRole.NONE, ("globex-us", TenantRole.ADMIN)),
]


class Command(BaseCommand):
    help = "Seed the demo tenants and users (idempotent)."

    @transaction.atomic
    def handle(self, *args: Any, **opts: Any) -> None:
        actor = Principal.system("seed_demo", source=AuditSource.COMMAND)
        for spec in TENANTS:
            if not Tenant.objects.filter(slug=spec["slug"]).exists():
                tenant_create(actor=actor, **spec)
        for username, role, membership in USERS:
            user = User.objects.filter(username=username).first()
            if user is None:
                user = user_create(
                    actor=actor,
                    username=username,
                    email=f"{username}@example.com",
                    password=DEMO_PASSWORD,
                    platform_role=role,
                )
            if membership and not user.memberships.filter(tenant__slug=membership[0]).exists():
                tenant = Tenant.objects.get(slug=membership[0])
                membership_set(actor=actor, tenant=tenant, user=user, role=membership[1])
        self.stdout.write(
            f"Demo world ready: tenants {', '.join(t['slug'] for t in TENANTS)}; "
            f"users {', '.join(u[0] for u in USERS)} (password {DEMO_PASSWORD})"
        )
