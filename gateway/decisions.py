"""Where a request goes, decided in this process: the route (the model asked for, or a fallback), whether
it is refused before any engine sees it (no compliant region, a budget's hard limit, shed under
saturation), and the endpoint of each attempt (tier, rollout revision, session, prefix, load), with the
circuit breakers that keep failing engines out."""

import logging

from gateway import contract
from gateway.admission import Admission
from gateway.balancer import answering, candidates, on_track, pick, split_track, track_of
from gateway.breakers import Breakers
from gateway.config import Settings
from gateway.limits import over_budget
from gateway.metrics import GatewayMetrics
from gateway.prefix import PrefixIndex
from gateway.reply import Reply

log = logging.getLogger("gateway")


class Decisions:
    def __init__(self, settings: Settings, metrics: GatewayMetrics):
        self.settings, self.metrics = settings, metrics
        self.breakers = Breakers(settings.ejection_seconds, settings.max_ejection_seconds)
        self.admission = Admission(settings.max_in_flight_per_endpoint)
        self.prefixes = PrefixIndex(settings.prefix_index_entries, settings.prefix_imbalance)

    def degrade(
        self,
        reply: Reply,
        tenant: str,
        view: contract.TenantRoutes,
        name: str,
        route: contract.Route,
        preview: str | None,
    ) -> contract.Route:
        """The route to serve: the model asked for, or its first fallback that can serve when it cannot
        (no compliant endpoint: unavailable; saturated: capacity) or the tenant is past its budget's
        degrade threshold (budget). A fallback is one of the tenant's own routes, whose endpoints the
        control plane held to the tenant's residency like any other; none usable: the model asked for."""
        fallbacks = route.get("fallbacks")
        if not fallbacks:
            return route
        if not route["endpoints"] and "activatable" not in route:
            reason = contract.UNAVAILABLE
        elif view.get("degraded"):
            reason = contract.BUDGET
        elif self.admission.saturated(self.first_tier(route, preview)):
            reason = contract.CAPACITY
        else:
            return route
        for fallback in fallbacks:
            other = view["models"].get(fallback)
            if other and other["endpoints"] and not self.admission.saturated(self.first_tier(other, preview)):
                reply.degraded, reply.served_name = reason, fallback
                self.metrics.degrade(tenant, name, reason)
                return other
        return route

    def refusal(
        self,
        tenant: str,
        view: contract.TenantRoutes,
        name: str,
        route: contract.Route,
        priority: str,
        preview: str | None,
    ) -> tuple[int, str, str, dict[str, str] | None] | None:
        """Why the request is refused before any limit is spent on it: no compliant region, a budget's
        hard limit, or the model saturated for its class (status, message, code, extra headers)."""
        if not route["endpoints"] and "activatable" not in route:
            self.metrics.refuse(tenant, "unavailable")
            return (
                503,
                route.get("unavailable", "No region can serve this model."),
                "residency_unavailable",
                None,
            )
        if view.get("blocked"):
            self.metrics.refuse(tenant, "budget")
            return (*over_budget(tenant, view["blocked"]), None)
        shed = self.admission.shed(tenant, priority, self.first_tier(route, preview))
        if shed:
            self.metrics.refuse(tenant, "shed")
            retry_after = {"retry-after": str(self.settings.shed_retry_after_seconds)}
            return 503, f"The model '{name}' is saturated: {shed}.", "overloaded", retry_after
        return None

    def first_tier(self, route: contract.Route, preview: str | None) -> list[contract.Endpoint]:
        """The endpoints a request's first attempt would choose from."""
        return candidates(
            answering(route["endpoints"], route.get("splits", {}), preview), self.breakers, set()
        )

    def choose(
        self,
        route: contract.Route,
        tried: set[str],
        split_key: str,
        affinity: str | None,
        preview: str | None,
        hashes: list[bytes],
    ) -> contract.Endpoint | None:
        """The endpoint for the next attempt: the tier, then the revision there, then the engine: a
        session's own, else the one whose prefix cache likely holds the prompt, else by load."""
        splits = route.get("splits", {})
        tier = candidates(answering(route["endpoints"], splits, preview), self.breakers, tried)
        if not tier:
            return None
        pool = on_track(tier, split_track(tier, splits, split_key, preview))
        if affinity is None and hashes and len(pool) > 1:
            chosen = self.prefixes.prefer(pool, hashes, self.admission.at_endpoint) or pick(pool, None)
            self.prefixes.remember(hashes, chosen["url"])  # requests in flight fill its cache too
            return chosen
        return pick(pool, affinity)

    def eject(self, endpoint: contract.Endpoint, attempt: int, error: str) -> None:
        seconds = self.breakers.failure(endpoint["url"])
        # Said once per ejection: who stops getting traffic from this process, and why, is what an
        # operator (or a rollout whose step saw traffic on one side only) needs to see.
        log.warning(
            "upstream %s (%s) ejected for %.0f s after attempt %d: %s",
            endpoint["url"],
            track_of(endpoint),
            seconds,
            attempt,
            error,
        )
