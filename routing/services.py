"""Every write of routing: publishing the route table (with the failovers it records) and the endpoint-health
state machine; one code path for the loop, the API and tests. Reads are in ``routing.selectors``."""

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.models import BudgetAlert
from core.choices import AuditSource, Scope
from core.errors import InvalidTransition, NotFound, ValidationFailed
from core.models import Tenant
from core.principal import Principal
from core.services.audit import audit_record
from gateway import contract
from regions.choices import TargetStatus
from regions.hooks import StatusChange
from regions.models import Region
from routing import selectors
from routing.choices import (
    FAILURES_TO_EJECT,
    HEALTH_TRANSITIONS,
    SUCCESSES_TO_RESTORE,
    Health,
    RoutingEventKind,
)
from routing.models import EndpointHealth, ResponseCachePolicy, RouteTable, RoutingEvent
from routing.pipelines import attach_pipelines
from routing.routes import route_table

log = logging.getLogger(__name__)

SYSTEM = Principal.system("router", source=AuditSource.TASK)
KEEP_GENERATIONS = 200
LONG_POLL_LIMIT = 30.0


def table_after(etag: str, wait: float) -> RouteTable:
    """The newest table, waiting up to ``wait`` seconds for one whose ETag differs from ``etag``; the first
    generation is published on demand (before the routing loop ever ran)."""
    deadline = time.monotonic() + min(max(wait, 0.0), LONG_POLL_LIMIT)
    while True:
        table = selectors.current() or publish()
        if table.etag != etag or time.monotonic() >= deadline:
            return table
        time.sleep(0.2)


SERVING = frozenset({TargetStatus.READY, TargetStatus.DEGRADED})


class Coalesced:
    """Runs an action for every call, but never two at once in a process: a call made while it runs only
    asks for one more run after it, which sees every change committed before it starts. A reconcile pass
    that brings thousands of targets up asks for thousands of tables and computes a handful (each is
    computed over the whole fleet, so one per change would cost the square of the fleet)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.again = False

    def __call__(self, action: Callable[[], object]) -> None:
        with self.lock:
            if self.running:
                self.again = True
                return
            self.running = True
        try:
            while True:
                action()
                with self.lock:
                    if not self.again:
                        return
                    self.again = False
        finally:
            with self.lock:
                self.running = False


_REPUBLISH = Coalesced()


def republish_when_serving_changes(changes: list[StatusChange]) -> None:
    """``regions.hooks.on_status_changed`` listener: a region that starts or stops serving is in the table
    now, not at the router's next round (a request held for a woken deployment waits for it). Never raises:
    the router's own round publishes anyway."""
    moved = [c for c in changes if c.before in SERVING or c.after in SERVING]
    if not moved:
        return
    try:
        _REPUBLISH(publish)
    except Exception:
        first = moved[0]
        log.exception("publishing after %s went %s → %s failed", first.target, first.before, first.after)


def publish(now: datetime | None = None) -> RouteTable:
    """Compute the table as of ``now`` (default: the wall clock; budgets, prices and token expiry depend on
    it); write a new generation only if it changed, recording failovers and failbacks."""
    now = now or timezone.now()
    tenants = route_table(selectors.policies(now), selectors.placements(now))
    attach_pipelines(tenants)
    body: contract.RouteTable = {
        "tenants": tenants,
        "credentials": selectors.credentials(now),
        "cache_salts": selectors.cache_salts(),
    }
    etag = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    latest = selectors.current()
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
        winner = selectors.current()
        if winner is None:  # not a lost race after all
            raise
        return winner
    RouteTable.objects.filter(generation__lte=table.generation - KEEP_GENERATIONS).delete()
    return table


def _primary(route: contract.Route) -> str:
    endpoints = route.get("endpoints") or []
    return str(endpoints[0]["region"]) if endpoints else ""


def _record_moves(before: dict[str, Any], after: dict[str, contract.TenantRoutes], generation: int) -> None:
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
    tenant: Tenant | None, name: str, was: str, now: str, route: contract.Route
) -> tuple[str, str] | None:
    """What a change of serving region is, judged against what this route lived through before; None when
    nothing failed and nothing came back (first service, or the preferred region joining at bring-up)."""
    history = RoutingEvent.objects.filter(tenant=tenant, model_name=name).exclude(
        kind__in=[RoutingEventKind.HEALTHY, RoutingEventKind.UNHEALTHY]
    )
    if not now and "activatable" in route:
        return None  # idled to zero by the autoscaler and woken by the next request: not an outage
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
    seen, _ = EndpointHealth.objects.get_or_create(url=url, defaults={"region": region})
    probed: dict[str, Any] = {
        "failures": 0 if ok else seen.failures + 1,
        "successes": seen.successes + 1 if ok else 0,
        "last_error": error[:500],
        "latency_ms": latency_ms,
        "checked_at": timezone.now(),
        **{key: load.get(key, 0.0) for key in ("running", "waiting", "kv_cache")},
    }
    to = _health_due(seen.state, probed["failures"], probed["successes"])
    if to is None:
        EndpointHealth.objects.filter(pk=seen.pk).update(**probed)  # never the state: only a transition
        return False
    try:
        endpoint_health_transition(seen, to, region=region, **probed)
    except InvalidTransition:  # another prober moved it first: its result stands, this one is dropped
        return False
    return True


def _health_due(state: str, failures: int, successes: int) -> str | None:
    """The state the consecutive probe results call for, when it is not ``state`` (the hysteresis)."""
    if state == Health.HEALTHY and failures >= FAILURES_TO_EJECT:
        return Health.UNHEALTHY
    if state == Health.UNHEALTHY and successes >= SUCCESSES_TO_RESTORE:
        return Health.HEALTHY
    return None


def endpoint_health_transition(health: EndpointHealth, to: str, *, region: Region, **probed: Any) -> None:
    """Move an endpoint to ``to`` by compare-and-set (with the probe result that moved it) and put the
    change on the timeline in the same transaction. A lost race (the state is no longer the one read)
    raises InvalidTransition and writes nothing."""
    if to not in HEALTH_TRANSITIONS.get(health.state, frozenset()):
        raise InvalidTransition(f"{health.url} cannot go from {health.state} to {to}.")
    at = probed.get("checked_at") or timezone.now()
    with transaction.atomic():
        moved = EndpointHealth.objects.filter(pk=health.pk, state=health.state).update(
            state=to, changed_at=at, **probed
        )
        if not moved:
            raise InvalidTransition(f"{health.url} is no longer {health.state}: someone moved it first.")
        error = probed.get("last_error", health.last_error)
        kind = RoutingEventKind.HEALTHY if to == Health.HEALTHY else RoutingEventKind.UNHEALTHY
        detail = f" ({error})" if error else ""
        RoutingEvent.objects.create(
            kind=kind, from_region=region.code, message=f"{health.url} is {to}{detail}"
        )
    for field, value in {**probed, "state": to, "changed_at": at}.items():
        setattr(health, field, value)


def forget_endpoints(live: Iterable[str]) -> None:
    EndpointHealth.objects.exclude(url__in=list(live)).delete()


def republish_for_budgets(alerts: list[BudgetAlert]) -> None:
    """A budget listener: a spent hard limit reaches the gateways with the next table generation."""
    publish()


MAX_CACHE_TTL_SECONDS = 7 * 24 * 3600
MODEL_NAME = re.compile(r"[-a-zA-Z0-9_]{1,40}")  # a deployment's name: what clients put in "model"


def response_cache_set(
    *, actor: Principal, tenant: Tenant, model_name: str, ttl_seconds: int
) -> ResponseCachePolicy:
    """Opt the tenant in to the gateways' response cache for one model name (or change its TTL); gateways
    cache from the next route table, published here."""
    actor.require(Scope.DEPLOYMENTS_WRITE, tenant.pk)
    if not MODEL_NAME.fullmatch(model_name):
        raise ValidationFailed(
            "A model name is a deployment's name: letters, digits, - and _ (at most 40).",
            detail={"model_name": ["Not a deployment name."]},
        )
    if not 1 <= ttl_seconds <= MAX_CACHE_TTL_SECONDS:
        raise ValidationFailed(
            f"ttl_seconds must be 1 to {MAX_CACHE_TTL_SECONDS} (a week).",
            detail={"ttl_seconds": ["Out of range."]},
        )
    with transaction.atomic():
        policy = (
            ResponseCachePolicy.objects.select_for_update()
            .filter(tenant=tenant, model_name=model_name)
            .first()
        )
        before = {"ttl_seconds": policy.ttl_seconds} if policy else None
        if policy is None:
            policy = ResponseCachePolicy(tenant=tenant, model_name=model_name, ttl_seconds=ttl_seconds)
        policy.ttl_seconds, policy.updated_at = ttl_seconds, timezone.now()
        policy.save()
        audit_record(
            actor=actor,
            action="response_cache.set",
            target=policy,
            tenant=tenant,
            before=before,
            after={"model_name": model_name, "ttl_seconds": ttl_seconds},
        )
    publish()
    return policy


def response_cache_clear(*, actor: Principal, tenant: Tenant, model_name: str) -> None:
    """Opt out: gateways stop caching with the next table and delete the tenant's entries for the model."""
    actor.require(Scope.DEPLOYMENTS_WRITE, tenant.pk)
    with transaction.atomic():
        policy = (
            ResponseCachePolicy.objects.select_for_update()
            .filter(tenant=tenant, model_name=model_name)
            .first()
        )
        if policy is None:
            raise NotFound(f"{tenant.slug} has no response cache for '{model_name}'.")
        audit_record(
            actor=actor,
            action="response_cache.cleared",
            target=policy,
            tenant=tenant,
            before={"model_name": model_name, "ttl_seconds": policy.ttl_seconds},
        )
        policy.delete()
    publish()
