from django.db import models


class Health(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    UNHEALTHY = "unhealthy", "Unhealthy"


class RoutingEventKind(models.TextChoices):
    FAILOVER = "failover", "Failover"
    FAILBACK = "failback", "Failback"
    UNAVAILABLE = "unavailable", "No compliant region"
    RESTORED = "restored", "Service restored"
    UNHEALTHY = "unhealthy", "Endpoint unhealthy"
    HEALTHY = "healthy", "Endpoint healthy"


# Endpoint health (``EndpointHealth.state``): consecutive probe results move it, nothing else does. Why
# these numbers (against Envoy's outlier detection): ``routing/health.py``.
FAILURES_TO_EJECT = 2
SUCCESSES_TO_RESTORE = 3
HEALTH_TRANSITIONS: dict[str, frozenset[str]] = {
    Health.HEALTHY: frozenset({Health.UNHEALTHY}),
    Health.UNHEALTHY: frozenset({Health.HEALTHY}),
}
