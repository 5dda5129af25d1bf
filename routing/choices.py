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


# Consecutive probe results before an endpoint's health changes; why these numbers: ``routing/health.py``.
FAILURES_TO_EJECT = 2
SUCCESSES_TO_RESTORE = 3
