"""What each caller may see of routing: operators everything, tenants their own routes and events; and the
snapshot of the platform the route table is computed from (policies, placements, credentials)."""

from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.crypto import salted_hmac

from artifacts.choices import ReplicaState
from artifacts.models import ArtifactReplica
from billing.reports import prices_now
from billing.selectors import over_budget, past_degrade_threshold
from core.choices import AuditSource, Scope, TenantStatus
from core.errors import Forbidden, NotFound
from core.models import ApiToken, Tenant
from core.principal import Principal
from core.residency import weights_of
from core.sealing import sealing_key_tag
from core.selectors import scoped, visible_tenant_slugs
from core.services import secrets
from gateway import contract
from regions.choices import DeploymentState, RegionStatus, TargetRole, TargetStatus
from regions.engine_keys import engine_api_key, key_fingerprint
from regions.models import DeploymentTarget, Region
from regions.selectors import deployments_for, gateway_refusal
from regions.workloads import target_version
from registry.choices import VersionStatus
from registry.models import RetrievalIndex
from routing.choices import Health, RoutingEventKind
from routing.models import EndpointHealth, ResponseCachePolicy, RouteTable, RoutingEvent
from routing.routes import Endpoint, Placement, TenantPolicy, route_table


def visible_tenants(principal: Principal) -> set[str] | None:
    """None: every tenant (an operator)."""
    return visible_tenant_slugs(principal, Scope.DEPLOYMENTS_READ)


def tenants_view(principal: Principal, tenants: dict[str, Any]) -> dict[str, Any]:
    allowed = visible_tenants(principal)
    return tenants if allowed is None else {slug: view for slug, view in tenants.items() if slug in allowed}


def response_caches(principal: Principal) -> QuerySet[ResponseCachePolicy]:
    """The response-cache opt-ins of the tenants the caller sees deployments of."""
    return scoped(ResponseCachePolicy.objects.select_related("tenant"), principal, Scope.DEPLOYMENTS_READ)


def endpoint_health(principal: Principal) -> QuerySet[EndpointHealth]:
    found = EndpointHealth.objects.select_related("region")
    if principal.sees_all(Scope.DEPLOYMENTS_READ):
        return found
    # Their deployments' endpoints, unhealthy ones included (those are no longer in the route table).
    targets = DeploymentTarget.objects.filter(deployment__in=deployments_for(principal))
    return found.filter(url__in={url for urls in targets.values_list("endpoints", flat=True) for url in urls})


def routing_events(principal: Principal) -> QuerySet[RoutingEvent]:
    return scoped(RoutingEvent.objects.select_related("tenant"), principal, Scope.DEPLOYMENTS_READ)


def what_if(principal: Principal, region_code: str) -> list[dict[str, Any]]:
    """If ``region_code`` failed: which tenants' models would lose service, and which would lose capacity."""
    tenants, served = policies(), placements()
    failed = [
        p if p.region != region_code else replace(p, region_active=False, draining=False) for p in served
    ]
    before = tenants_view(principal, route_table(tenants, served))
    after = tenants_view(principal, route_table(tenants, failed))
    impact = []
    for slug, view in sorted(before.items()):
        for name, route in sorted(view["models"].items()):
            now = after[slug]["models"][name]
            lost = [e for e in route["endpoints"] if e["region"] == region_code]
            if not lost and route["endpoints"]:
                continue
            if not route["endpoints"]:
                continue  # already unavailable; the region changes nothing
            impact.append(
                {
                    "tenant": slug,
                    "model": name,
                    "effect": "loses service" if not now["endpoints"] else "loses capacity",
                    "endpoints_before": len(route["endpoints"]),
                    "endpoints_after": len(now["endpoints"]),
                    "served_from_after": sorted({e["region"] for e in now["endpoints"]}),
                    "reason": now.get("unavailable", ""),
                }
            )
    return impact


SERVICE_EVENTS = (
    RoutingEventKind.FAILOVER,
    RoutingEventKind.FAILBACK,
    RoutingEventKind.UNAVAILABLE,
    RoutingEventKind.RESTORED,
)


def service_events(principal: Principal) -> QuerySet[RoutingEvent]:
    """Failovers, failbacks and outages the caller may see, newest first (the overview's timeline)."""
    return routing_events(principal).filter(kind__in=SERVICE_EVENTS)


def region_health(principal: Principal) -> dict[str, dict[str, Any]]:
    """Per region code: the prober's healthy and unhealthy endpoints (the caller's own, for a tenant
    member) and one word for the region: the operator's status if not active, else healthy/degraded."""
    counts: dict[str, dict[str, Any]] = {}
    for code, state in endpoint_health(principal).values_list("region__code", "state"):
        found = counts.setdefault(code, {Health.HEALTHY: 0, Health.UNHEALTHY: 0})
        found[state] += 1
    health = {}
    for region in Region.objects.all():
        found = counts.get(region.code, {Health.HEALTHY: 0, Health.UNHEALTHY: 0})
        if region.status != RegionStatus.ACTIVE:
            word = region.status
        else:
            word = "degraded" if found[Health.UNHEALTHY] else "healthy"
        health[region.code] = {
            "state": word,
            "healthy": found[Health.HEALTHY],
            "unhealthy": found[Health.UNHEALTHY],
        }
    return health


def current() -> RouteTable | None:
    return RouteTable.objects.order_by("-generation").first()


def active_endpoints() -> list[tuple[str, Region]]:
    """Every endpoint of an active deployment, with its region: what the prober checks."""
    targets = DeploymentTarget.objects.filter(deployment__state=DeploymentState.ACTIVE).select_related(
        "region"
    )
    return [(url, target.region) for target in targets for url in target.endpoints]


def _location(region: Region | None) -> tuple[float, float] | None:
    if region is None or region.latitude is None or region.longitude is None:
        return None
    return (region.latitude, region.longitude)


def policies(now: datetime | None = None) -> list[TenantPolicy]:
    regions = {r.code: r for r in Region.objects.all()}
    caches: dict[int, dict[str, int]] = {}
    for tenant_id, name, ttl in ResponseCachePolicy.objects.values_list(
        "tenant_id", "model_name", "ttl_seconds"
    ):
        caches.setdefault(tenant_id, {})[name] = ttl
    blocked = over_budget(now=now)
    degraded = past_degrade_threshold(now=now)
    return [
        TenantPolicy(
            slug=tenant.slug,
            residency=frozenset(tenant.residency),
            home=_location(regions.get(tenant.home_region)),
            limits=_limits(tenant),
            blocked=(
                f"the monthly budget of {tenant.monthly_budget} {tenant.budget_currency} is spent; "
                "new requests are refused until next month or a higher budget"
                if tenant.pk in blocked
                else ""
            ),
            degraded=(
                f"budget: {tenant.budget_degrade_at} % of the monthly budget is spent"
                if tenant.pk in degraded
                else ""
            ),
            response_cache=caches.get(tenant.pk, {}),
        )
        for tenant in Tenant.objects.filter(status=TenantStatus.ACTIVE)
    ]


def _limits(tenant: Tenant) -> contract.TenantLimits:
    """The tenant's limits for the gateways; one not set (or zero) is left out."""
    limits: contract.TenantLimits = {}
    if tenant.requests_per_minute:
        limits["requests_per_minute"] = tenant.requests_per_minute
    if tenant.tokens_per_minute:
        limits["tokens_per_minute"] = tenant.tokens_per_minute
    if tenant.concurrent_requests:
        limits["concurrent_requests"] = tenant.concurrent_requests
    return limits


def placements(now: datetime | None = None) -> list[Placement]:
    health = {h.url: h for h in EndpointHealth.objects.all()}
    verified = set(
        ArtifactReplica.objects.filter(state=ReplicaState.READY).values_list("version_id", "region_id")
    )
    targets = (
        DeploymentTarget.objects.filter(deployment__state=DeploymentState.ACTIVE)
        .exclude(role=TargetRole.RETIRING)  # out of the route table at once; its workload drains
        # Thousands of targets share a few regions, versions and owners and a fifth as many deployments
        # (wide rows, JSON columns): read each once, not once per target as a join would.
        .prefetch_related(
            "region", "deployment__owner", "deployment__version__model__owner", "version__model__owner"
        )
        .defer("cold_starts", "last_error")
    )
    price_of = prices_now(now)  # the GPU price in force: the tiebreaker between regions
    everyone = list(Tenant.objects.filter(status=TenantStatus.ACTIVE).values_list("slug", flat=True))
    own_names = set(
        targets.filter(deployment__shared=False).values_list("deployment__owner__slug", "deployment__name")
    )
    found = []
    for target in targets:
        deployment, version, region = target.deployment, target_version(target), target.region
        candidate = target.role == TargetRole.CANDIDATE
        endpoints = tuple(_endpoint(url, health.get(url)) for url in target.endpoints)
        # A shared deployment is offered to every tenant, except where a tenant runs its own of that name.
        callers = (
            [t for t in everyone if (t, deployment.name) not in own_names]
            if deployment.shared
            else [deployment.owner.slug]
        )
        found += [
            Placement(
                tenant=caller,
                name=deployment.name,
                deployment_id=deployment.pk,
                version=f"{version.model.name}@{version.version}",
                served_model=version.served_model_name,
                artifact_sha256=version.artifact_sha256,
                allowed_jurisdictions=frozenset(version.allowed_jurisdictions),
                region=region.code,
                jurisdiction=region.jurisdiction,
                region_active=region.status == RegionStatus.ACTIVE,
                draining=region.status == RegionStatus.DRAINING,
                ready=target.status in (TargetStatus.READY, TargetStatus.DEGRADED) and bool(endpoints),
                weights_verified=not region.object_store or (version.pk, region.pk) in verified,
                endpoints=endpoints,
                owner=weights_of(version).owner,
                location=_location(region),
                gpu_hour_price=price_of(region, deployment.gpu_type),
                shared=deployment.shared,
                track=contract.CANDIDATE if candidate else contract.STABLE,
                traffic_percent=target.traffic_percent if candidate else 0,
                mirror_percent=target.mirror_percent if candidate else 0,
                activatable=_activatable(target),
                overflow_of=target.overflow_of,
                fallbacks=tuple(deployment.fallbacks),
                production=version.status == VersionStatus.PRODUCTION,
            )
            for caller in callers
        ]
    return found


def _activatable(target: DeploymentTarget) -> bool:
    """At zero because the autoscaler found it idle (not paused by hand), or woken by a request and still
    starting: requests for it are held, not refused (the reconciler clears the mark once it serves)."""
    return target.wakes_on_request and target.deployment.state == DeploymentState.ACTIVE


def _endpoint(url: str, seen: EndpointHealth | None) -> Endpoint:
    if seen is None:  # not probed yet: the reconciler saw it answer /health, which made it ready
        return Endpoint(url)
    return Endpoint(url, seen.state == Health.HEALTHY, seen.running, seen.waiting, seen.kv_cache)


def credentials(now: datetime | None = None) -> dict[str, contract.Credential]:
    """Token digest → the one tenant it is bound to and may call models for (for offline authentication)."""
    now = now or timezone.now()
    tokens = (
        ApiToken.objects.filter(revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .select_related("user", "service_account__tenant", "tenant")
    )
    found: dict[str, contract.Credential] = {}
    for token in tokens:
        if Scope.MODELS_INVOKE not in token.scopes:
            continue
        principal = _principal_of(token)
        if principal is None:
            continue
        tenants = [
            tenant.slug
            for tenant in _tenants_of(token)
            if principal.may(Scope.MODELS_INVOKE, tenant.pk) and tenant.status == TenantStatus.ACTIVE
        ]
        if tenants:
            expires = token.expires_at.timestamp() if token.expires_at else None
            found[token.digest] = {
                "tenants": sorted(tenants),
                "token": token.prefix,
                "expires": expires,
                "priority": token.priority,
            }
    return found


def cache_salts() -> dict[str, str]:
    """Each tenant's vLLM ``cache_salt`` on shared deployments, for gateways only (like the digests).

    An HMAC of the tenant under the control plane's secret key: stable (every gateway sends the same, so
    the tenant's own prefixes stay cached), and no tenant can compute another's.
    """
    slugs = Tenant.objects.filter(status=TenantStatus.ACTIVE).values_list("slug", flat=True)
    return {
        slug: salted_hmac("routing.cache_salt", slug, algorithm="sha256").hexdigest()[:32] for slug in slugs
    }


def _principal_of(token: ApiToken) -> Principal | None:
    if token.user is not None:
        return (
            Principal.for_user(token.user, source=AuditSource.API, token=token)
            if token.user.is_active
            else None
        )
    robot = token.service_account
    if robot is None or not robot.is_active:
        return None
    return Principal.for_service_account(robot, token=token, source=AuditSource.API)


def _tenants_of(token: ApiToken) -> list[Tenant]:
    """Exactly the tenant the token is bound to: an unbound token is not valid at the gateway."""
    return [token.tenant] if token.tenant is not None else []


def for_gateways(
    body: contract.RouteTable, gateway_regions: frozenset[str], secrets_wanted: bool = True
) -> contract.RouteTable:
    """The table as gateways get it: every endpoint with its deployment's engine API key, every pipeline's
    ``http`` stage with the value of the tenant's secret it sends, if the gateway runs pipelines
    (``secrets_wanted``; the global entry does not) and the pipeline may run in every region the gateway
    serves (its ``regions``, as the gateway itself checks). A copy: the stored table, which people and
    exports read, has neither."""
    keys: dict[int, str] = {}
    wanted = {
        (slug, stage["secret"])
        for slug, view in body.get("tenants", {}).items()
        for route in view.get("pipelines", {}).values()
        if not gateway_regions or gateway_regions <= set(route.get("regions", []))
        for stage in route["stages"]
        if "secret" in stage
    }
    values = secrets.secret_values(wanted) if secrets_wanted and wanted else {}
    tenants = {
        slug: {
            **view,
            "models": {
                name: {
                    **route,
                    "endpoints": [
                        {**e, "api_key": keys.setdefault(e["deployment"], engine_api_key(e["deployment"]))}
                        for e in route["endpoints"]
                    ],
                }
                for name, route in view["models"].items()
            },
            **({"pipelines": _with_secrets(slug, view["pipelines"], values)} if "pipelines" in view else {}),
        }
        for slug, view in body.get("tenants", {}).items()
    }
    return {**body, "tenants": tenants}  # type: ignore[typeddict-item]


def _with_secrets(
    tenant: str, pipelines: dict[str, contract.PipelineRoute], values: dict[tuple[str, str], str]
) -> dict[str, Any]:
    def stage(wire: contract.PipelineStage) -> contract.PipelineStage:
        value = values.get((tenant, wire["secret"])) if "secret" in wire else None
        return {**wire, "secret_value": value} if value is not None else wire

    return {
        name: {**route, "stages": [stage(s) for s in route["stages"]]} for name, route in pipelines.items()
    }


def secret_keys_tag() -> str:
    """Names the generation of the keys behind what only gateways get (the engine keys' root, the key
    tenants' secrets are sealed with) without giving them away."""
    return key_fingerprint(0)[:8] + sealing_key_tag()


def index_for_gateways(tenant: str, name: str, gateway_regions: frozenset[str]) -> contract.RetrievalIndex:
    found = RetrievalIndex.objects.filter(owner__slug=tenant, name=name).select_related("owner").first()
    if found is None:
        raise NotFound(f"No index '{tenant}/{name}'.")
    refusal = gateway_refusal(found.owner, gateway_regions)
    if refusal:  # its documents never leave the tenant's residency, whatever gateway asks
        raise Forbidden(f"Index {tenant}/{name} may not be sent to this gateway: {refusal}.")
    documents: list[Any] = list(found.documents.order_by("pk").values("key", "text", "vector"))
    return {"revision": found.revision, "dimensions": found.dimensions, "documents": documents}
