"""Building, publishing and watching the route table; one code path for the loop, the API and tests."""

import hashlib
import json
import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.crypto import salted_hmac

from artifacts.choices import ReplicaState
from artifacts.models import ArtifactReplica
from billing.reports import prices_now
from billing.selectors import over_budget
from controlplane.choices import AuditSource, Scope, TenantStatus
from controlplane.models import ApiToken, Tenant
from controlplane.principal import Principal
from controlplane.residency import weights_of
from controlplane.services.audit import audit_record
from regions.choices import DeploymentState, RegionStatus, TargetStatus
from regions.models import DeploymentTarget, Region
from routing.choices import Health, RoutingEventKind
from routing.models import EndpointHealth, RouteTable, RoutingEvent
from routing.routes import Endpoint, Placement, TenantPolicy, route_table

log = logging.getLogger(__name__)
SYSTEM = Principal.system("router", source=AuditSource.TASK)
KEEP_GENERATIONS = 200


def _location(region: Region | None) -> tuple[float, float] | None:
    if region is None or region.latitude is None or region.longitude is None:
        return None
    return (region.latitude, region.longitude)


def policies(now: datetime | None = None) -> list[TenantPolicy]:
    regions = {r.code: r for r in Region.objects.all()}
    blocked = over_budget(now=now)
    return [
        TenantPolicy(
            slug=tenant.slug,
            residency=frozenset(tenant.residency),
            home=_location(regions.get(tenant.home_region)),
            limits={
                key: value
                for key, value in (
                    ("requests_per_minute", tenant.requests_per_minute),
                    ("tokens_per_minute", tenant.tokens_per_minute),
                )
                if value
            },
            blocked=(
                f"the monthly budget of {tenant.monthly_budget} {tenant.budget_currency} is spent; "
                "new requests are refused until next month or a higher budget"
                if tenant.pk in blocked
                else ""
            ),
        )
        for tenant in Tenant.objects.filter(status=TenantStatus.ACTIVE)
    ]


def placements(now: datetime | None = None) -> list[Placement]:
    health = {h.url: h for h in EndpointHealth.objects.all()}
    verified = set(
        ArtifactReplica.objects.filter(state=ReplicaState.READY).values_list("version_id", "region_id")
    )
    targets = DeploymentTarget.objects.filter(deployment__state=DeploymentState.ACTIVE).select_related(
        "deployment__owner", "deployment__version__model__owner", "region"
    )
    price_of = prices_now(now)  # the GPU price in force: the tiebreaker between regions
    everyone = list(Tenant.objects.filter(status=TenantStatus.ACTIVE).values_list("slug", flat=True))
    own_names = set(
        targets.filter(deployment__shared=False).values_list("deployment__owner__slug", "deployment__name")
    )
    found = []
    for target in targets:
        deployment, version, region = target.deployment, target.deployment.version, target.region
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
                ready=target.status in (TargetStatus.READY, TargetStatus.DEGRADED) and bool(endpoints),
                weights_verified=not region.object_store or (version.pk, region.pk) in verified,
                endpoints=endpoints,
                owner=weights_of(version).owner,
                location=_location(region),
                gpu_hour_price=price_of(region, deployment.gpu_type),
                shared=deployment.shared,
            )
            for caller in callers
        ]
    return found


def _endpoint(url: str, seen: EndpointHealth | None) -> Endpoint:
    if seen is None:  # not probed yet: the reconciler saw it answer /health, which made it ready
        return Endpoint(url)
    return Endpoint(url, seen.state == Health.HEALTHY, seen.running, seen.waiting, seen.kv_cache)


def credentials(now: datetime | None = None) -> dict[str, dict[str, Any]]:
    """Token digest → the one tenant it is bound to and may call models for (for offline authentication)."""
    now = now or timezone.now()
    tokens = (
        ApiToken.objects.filter(revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .select_related("user", "service_account__tenant", "tenant")
    )
    found = {}
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
            found[token.digest] = {"tenants": sorted(tenants), "token": token.prefix, "expires": expires}
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


def current() -> RouteTable | None:
    return RouteTable.objects.order_by("-generation").first()


def publish(now: datetime | None = None) -> RouteTable:
    """Compute the table as of ``now`` (default: the wall clock; budgets, prices and token expiry depend on
    it); write a new generation only if it changed, recording failovers and failbacks."""
    now = now or timezone.now()
    body: dict[str, Any] = {
        "tenants": route_table(policies(now), placements(now)),
        "credentials": credentials(now),
        "cache_salts": cache_salts(),
    }
    etag = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    latest = current()
    if latest is not None and latest.etag == etag:
        return latest
    try:
        with transaction.atomic():
            table = RouteTable.objects.create(
                generation=(latest.generation + 1) if latest else 1, etag=etag, body=body
            )
            if latest is not None:
                _record_moves(latest.body.get("tenants", {}), body["tenants"], table.generation)
    except IntegrityError:  # another publisher wrote this generation first; theirs is as fresh
        return current() or publish(now)
    RouteTable.objects.filter(generation__lte=table.generation - KEEP_GENERATIONS).delete()
    return table


def _primary(route: dict[str, Any]) -> str:
    endpoints = route.get("endpoints") or []
    return str(endpoints[0]["region"]) if endpoints else ""


def _record_moves(before: dict[str, Any], after: dict[str, Any], generation: int) -> None:
    """Compare where each tenant's model was served first, before and after; audit every failover,
    failback, outage and restore (a model coming up for the first time is none of these)."""
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=after)}
    for slug, view in after.items():
        for name, route in view["models"].items():
            old = before.get(slug, {}).get("models", {}).get(name)
            if old is None:
                continue
            was, now = _primary(old), _primary(route)
            if was == now:
                continue
            move = _move(tenants.get(slug), name, was, now, route)
            if move is None:
                continue
            kind, message = move
            RoutingEvent.objects.create(
                kind=kind,
                tenant=tenants.get(slug),
                model_name=name,
                from_region=was,
                to_region=now,
                message=message,
                generation=generation,
            )
            audit_record(actor=SYSTEM, action=f"routing.{kind}", tenant=tenants.get(slug), message=message)


def _move(
    tenant: Tenant | None, name: str, was: str, now: str, route: dict[str, Any]
) -> tuple[str, str] | None:
    """What a change of serving region is, judged against what this route lived through before; None when
    nothing failed and nothing came back (first service, or the preferred region joining at bring-up)."""
    history = RoutingEvent.objects.filter(tenant=tenant, model_name=name).exclude(
        kind__in=[RoutingEventKind.HEALTHY, RoutingEventKind.UNHEALTHY]
    )
    if not now:
        return RoutingEventKind.UNAVAILABLE, f"{name}: {route.get('unavailable', 'no region can serve')}"
    if not was:
        last = history.order_by("-at", "-pk").first()
        if last is None or last.kind != RoutingEventKind.UNAVAILABLE:
            return None  # served for the first time: nothing was lost, so nothing is restored
        return RoutingEventKind.RESTORED, f"{name}: served again from {now}"
    if now == route.get("preferred"):
        if not history.filter(from_region=now).exists():
            return None  # the preferred region joined after another came up first: nothing failed
        return RoutingEventKind.FAILBACK, f"{name}: traffic back from {was} to {now}"
    return RoutingEventKind.FAILOVER, f"{name}: traffic moved from {was} to {now}"


def record_health(
    url: str, region: Region, ok: bool, error: str, latency_ms: float | None, load: dict[str, float]
) -> bool:
    """Apply one probe result with hysteresis; True when the endpoint changed state."""
    from routing.health import FAILURES_TO_EJECT, SUCCESSES_TO_RESTORE

    seen, _ = EndpointHealth.objects.get_or_create(url=url, defaults={"region": region})
    seen.failures = 0 if ok else seen.failures + 1
    seen.successes = seen.successes + 1 if ok else 0
    seen.last_error, seen.latency_ms, seen.checked_at = error[:500], latency_ms, timezone.now()
    for key in ("running", "waiting", "kv_cache"):
        setattr(seen, key, load.get(key, 0.0))
    changed = False
    if seen.state == Health.HEALTHY and seen.failures >= FAILURES_TO_EJECT:
        seen.state, changed = Health.UNHEALTHY, True
    elif seen.state == Health.UNHEALTHY and seen.successes >= SUCCESSES_TO_RESTORE:
        seen.state, changed = Health.HEALTHY, True
    if changed:
        seen.changed_at = seen.checked_at
        kind = RoutingEventKind.HEALTHY if seen.state == Health.HEALTHY else RoutingEventKind.UNHEALTHY
        detail = f" ({seen.last_error})" if seen.last_error else ""
        RoutingEvent.objects.create(
            kind=kind, from_region=region.code, message=f"{url} is {seen.state}{detail}"
        )
    seen.save()
    return changed


def forget_endpoints(live: Iterable[str]) -> None:
    EndpointHealth.objects.exclude(url__in=list(live)).delete()
