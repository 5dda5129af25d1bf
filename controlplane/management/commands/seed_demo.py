"""A demo world: an EU tenant and a US tenant, each with an admin, plus platform staff. Safe to re-run."""

import hashlib
import os
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone

from autoscaling.models import AutoscalingPolicy
from autoscaling.services.policies import policy_set
from billing.models import GpuPrice
from billing.services import price_set, usage_ingest
from core.choices import AuditSource, PlatformRole, Scope, TenantRole
from core.models import ServiceAccount, Tenant, User
from core.principal import Principal
from core.services.tenants import membership_set, service_account_create, tenant_create
from core.services.tokens import TokenRejected, token_authenticate, token_create
from core.services.users import user_create
from regions.choices import DeploymentState
from regions.engines.tiny_model import write_tiny_model
from regions.models import Deployment, Region
from regions.services.deployments import deployment_create
from regions.services.regions import region_create
from registry.models import ModelVersion, RegisteredModel
from registry.services.lifecycle import version_transition
from registry.services.models import model_register
from registry.services.reports import report_submit
from registry.services.versions import version_register

DEMO_PASSWORD = "inference-demo-2026"
TENANTS: list[dict[str, Any]] = [
    {
        "slug": "acme-eu",
        "name": "Acme Europe",
        "residency": ["EU", "CH"],
        "home_region": "eu-west-1",
        "max_gpus": 16,
        "monthly_budget": "25000.00",
        "budget_currency": "USD",
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


REGIONS: list[dict[str, Any]] = [
    {
        "code": "eu-west-1",
        "name": "Dublin",
        "provider": "local",
        "city": "Dublin",
        "latitude": 53.35,
        "longitude": -6.26,
        "jurisdiction": "EU",
        "certifications": ["GDPR", "ISO27001"],
    },
    {
        "code": "eu-central-1",
        "name": "Frankfurt",
        "provider": "local",
        "city": "Frankfurt",
        "latitude": 50.11,
        "longitude": 8.68,
        "jurisdiction": "EU",
        "certifications": ["GDPR", "C5"],
    },
    {
        "code": "us-east-1",
        "name": "N. Virginia",
        "provider": "local",
        "city": "Ashburn",
        "latitude": 39.04,
        "longitude": -77.49,
        "jurisdiction": "US",
        "certifications": ["SOC2", "HIPAA"],
    },
]


DEMO_PRICES = {"eu-west-1": Decimal("0.85"), "eu-central-1": Decimal("0.92"), "us-east-1": Decimal("0.80")}


def seed_regions(actor: Principal, engine: str = "auto") -> None:
    """Local process-driver regions: with engine "auto", real vLLM engines when the engine extra is
    installed, else simulated. Existing regions keep the engine they were created with."""
    for spec in REGIONS:
        if not Region.objects.filter(code=spec["code"]).exists():
            region_create(
                actor=actor,
                driver="process",
                driver_config={"engine": engine},
                gpu_pools=[{"gpu_type": "L4", "memory_gib": 24, "gpu_count": 4}],
                **spec,
            )
        region = Region.objects.get(code=spec["code"])
        if not GpuPrice.objects.filter(region=region).exists():
            price_set(
                actor=actor,
                region=region,
                gpu_type="L4",
                pricing_model="on_demand",
                hourly_price=DEMO_PRICES[spec["code"]],
                currency="USD",
                effective_from=datetime(2026, 1, 1, tzinfo=UTC),
            )


def seed_tokens(actor: Principal) -> None:
    """The local gateway's token (gateway:sync) and one models:invoke token per demo tenant, in var/tokens/.

    A file is rewritten only when its token no longer works, so re-seeding keeps tokens that clients use.
    """
    folder = settings.VAR_DIR / "tokens"
    folder.mkdir(parents=True, exist_ok=True)
    robots = [("gateway", None, PlatformRole.ADMIN, Scope.GATEWAY_SYNC)] + [
        (spec["slug"], Tenant.objects.get(slug=spec["slug"]), TenantRole.DEVELOPER, Scope.MODELS_INVOKE)
        for spec in TENANTS
    ]
    for file_name, tenant, role, scope in robots:
        path = folder / file_name
        if path.exists() and _works(path.read_text().strip()):
            continue
        name = "gateway" if tenant is None else "demo-app"
        robot = ServiceAccount.objects.filter(tenant=tenant, name=name).first() or service_account_create(
            actor=actor, name=name, role=role, tenant=tenant
        )
        _, raw = token_create(actor=actor, name=f"{name} (demo)", scopes=[scope], service_account=robot)
        path.write_text(raw + "\n")
        path.chmod(0o600)


def _works(raw: str) -> bool:
    try:
        token_authenticate(raw)
    except TokenRejected:  # unknown here (another database), revoked or expired: mint a new one
        return False
    return True


def seed_catalog(actor: Principal) -> None:
    """A tiny random-weight Llama in the platform catalog, in production, allowed in the EU and the US."""
    model_dir = write_tiny_model(settings.VAR_DIR / "models" / "tiny-llama")
    model = RegisteredModel.objects.filter(owner=None, name="tiny-llama").first() or model_register(
        actor=actor,
        owner=None,
        name="tiny-llama",
        visibility="catalog",
        task="chat",
        license="Apache-2.0",
        description="A 2-layer random-weight Llama for demos and tests; vLLM serves it on a CPU.",
    )
    if not model.versions.exists():
        version = _tiny_release(actor, model, model_dir, "1.0.0")
        for state in ("validating", "validated", "staged", "canary", "production"):
            version_transition(
                actor=actor, version=version, to=state, reason="demo catalog", override=state == "production"
            )
    if not model.versions.filter(version="1.1.0").exists():
        # A next release, staged: what an operator (or CI) rolls out onto the demo deployment.
        version = _tiny_release(actor, model, model_dir, "1.1.0")
        for state in ("validating", "validated", "staged"):
            version_transition(actor=actor, version=version, to=state, reason="demo catalog")


def _tiny_release(actor: Principal, model: RegisteredModel, model_dir: Path, number: str) -> ModelVersion:
    version, _ = version_register(
        actor=actor,
        model=model,
        version=number,
        artifact_uri=f"file://{model_dir}",
        artifact_sha256=hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest(),
        artifact_size_bytes=sum(f.stat().st_size for f in model_dir.iterdir()),
        artifact_format="safetensors",
        served_model_name="tiny-llama",
        runtime_version="0.32.0",
        runtime_image="vllm/vllm-openai-cpu:v0.32.0",
        max_context_length=512,
        parameter_count=3_000_000,
        dtype="float32",
        engine_args={"load_format": "dummy", "dtype": "float32", "max_model_len": 512},
        architecture={
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 64,
        },
        allowed_jurisdictions=["EU", "US"],
        data_classification="public",
        artifact_manifest=[
            {
                "path": f.name,
                "sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
                "size_bytes": f.stat().st_size,
            }
            for f in sorted(model_dir.iterdir())
        ],
    )
    report_submit(actor=actor, version=version, metrics={})
    return version


# What a newcomer finds running: the catalog model deployed for a demo tenant, and a little traffic.
DEMO_DEPLOYMENTS = [{"tenant": "acme-eu", "name": "chat", "region": "eu-west-1"}]
DEMO_REQUESTS = 24  # spread over the hour before the first seed
# Sized to demand from the first minute: a second replica when more than four requests run on one.
DEMO_AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "running": 4}


def seed_deployments(actor: Principal) -> None:
    """Deploy tiny-llama where a demo tenant lives; the worker's reconciler starts it (a simulated engine,
    or real vLLM when the engine extra is installed). An existing deployment of that name is left alone."""
    model = RegisteredModel.objects.get(owner=None, name="tiny-llama")
    for spec in DEMO_DEPLOYMENTS:
        tenant = Tenant.objects.get(slug=spec["tenant"])
        live = Deployment.objects.exclude(state=DeploymentState.DELETED)
        deployment = live.filter(owner=tenant, name=spec["name"]).first()
        if deployment is None:
            deployment = deployment_create(
                actor=actor,
                owner=tenant,
                name=spec["name"],
                model=model,
                version="1.0.0",
                regions=[spec["region"]],
            )
        if not AutoscalingPolicy.objects.filter(deployment=deployment).exists():
            policy_set(actor=actor, deployment=deployment, body=DEMO_AUTOSCALING)
        seed_usage(actor, deployment, spec["region"])


def seed_usage(actor: Principal, deployment: Deployment, region: str) -> None:
    """A little past traffic so Costs and the Overview have tokens to show. The request ids are fixed, so
    a second seed is deduplicated by usage ingest and adds nothing."""
    first = f"seed-demo-{deployment.owner.slug}-{deployment.name}-"
    if deployment.usage.filter(request_id__startswith=first).exists():
        return
    now = timezone.now()
    records = [
        {
            "request_id": f"{first}{n:03d}",
            "tenant": deployment.owner.slug,
            "model_name": deployment.name,
            "region": region,
            "deployment": deployment.pk,
            "version": f"{deployment.model.name}@{deployment.version.version}",
            "endpoint": "seed_demo",
            "status": 200,
            "prompt_tokens": 40 + n,
            "completion_tokens": 60 + 2 * n,
            "latency_ms": 120.0 + n,
            "started_at": (now - timedelta(minutes=60 - 60 * n // DEMO_REQUESTS)).isoformat(),
        }
        for n in range(DEMO_REQUESTS)
    ]
    usage_ingest(actor=actor, records=records)


class Command(BaseCommand):
    help = "Seed the demo tenants, users, regions and catalog model (idempotent)."

    @transaction.atomic
    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--engine",
            choices=["auto", "simulator", "vllm"],
            default=os.environ.get("DEMO_ENGINE", "auto"),
            help="Engine of the demo regions (default: $DEMO_ENGINE, else auto: vLLM when installed)",
        )

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
        seed_regions(actor, opts["engine"])
        seed_catalog(actor)
        seed_deployments(actor)
        seed_tokens(actor)
        self.stdout.write(
            f"Demo world ready: tenants {', '.join(t['slug'] for t in TENANTS)}; "
            f"users {', '.join(u[0] for u in USERS)} (password {DEMO_PASSWORD}); "
            f"deployed {', '.join('{tenant}/{name} in {region}'.format(**d) for d in DEMO_DEPLOYMENTS)}"
        )
