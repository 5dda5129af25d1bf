from django.db import models
from django.utils import timezone

from routing.choices import Health, RoutingEventKind


class RouteTable(models.Model):
    """One published generation of the route table; gateways fetch the newest by ETag or long-poll.

    ``body`` holds {"tenants": {slug: {"models": ..., "limits": ...}}, "credentials": {...}}; a new row is
    written only when the content changes, so the generation counts real changes.
    """

    generation = models.PositiveBigIntegerField(unique=True)
    etag = models.CharField(max_length=64)
    body = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-generation"]

    def __str__(self) -> str:
        return f"route table #{self.generation}"


class EndpointHealth(models.Model):
    """What the prober saw of one engine endpoint, with hysteresis counters and vLLM's load gauges.

    ``state``: healthy → unhealthy after ``FAILURES_TO_EJECT`` consecutive failed probes, unhealthy →
    healthy after ``SUCCESSES_TO_RESTORE`` consecutive successes (``choices.HEALTH_TRANSITIONS``); a new
    endpoint starts healthy. Only ``services.endpoint_health_transition`` moves it (compare-and-set, with
    the ``RoutingEvent`` in the same transaction).
    """

    url = models.CharField(max_length=500, unique=True)
    region = models.ForeignKey("regions.Region", on_delete=models.CASCADE, related_name="endpoint_health")
    state = models.CharField(max_length=16, choices=Health.choices, default=Health.HEALTHY)
    failures = models.PositiveIntegerField(default=0)  # consecutive
    successes = models.PositiveIntegerField(default=0)  # consecutive
    last_error = models.CharField(max_length=500, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    running = models.FloatField(default=0)
    waiting = models.FloatField(default=0)
    kv_cache = models.FloatField(default=0)
    checked_at = models.DateTimeField(default=timezone.now)
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["url"]

    def __str__(self) -> str:
        return f"{self.url} ({self.state})"


class RoutingEvent(models.Model):
    """The timeline on the routing page: failovers, failbacks, outages, endpoint health changes."""

    kind = models.CharField(max_length=16, choices=RoutingEventKind.choices)
    tenant = models.ForeignKey(
        "controlplane.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="routing_events"
    )
    model_name = models.CharField(max_length=100, blank=True)
    from_region = models.CharField(max_length=41, blank=True)
    to_region = models.CharField(max_length=41, blank=True)
    message = models.TextField()
    generation = models.PositiveBigIntegerField(null=True, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class ResponseCachePolicy(models.Model):
    """A tenant's opt-in to the gateways' response cache for one model name: deterministic requests
    (temperature 0 or a fixed seed, embeddings) are answered again from the cache for ``ttl_seconds``."""

    tenant = models.ForeignKey(
        "controlplane.Tenant", on_delete=models.CASCADE, related_name="response_caches"
    )
    model_name = models.CharField(max_length=100)
    ttl_seconds = models.PositiveIntegerField()
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant__slug", "model_name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "model_name"], name="one_response_cache_per_model"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.model_name}: {self.ttl_seconds} s"
