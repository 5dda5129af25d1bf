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
