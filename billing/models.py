"""Metering: one row per request served through a gateway (the source of cost attribution)."""

from django.db import models
from django.utils import timezone


class UsageRecord(models.Model):
    """A request as the gateway saw it. ``request_id`` is unique, so a batch sent twice counts once.

    Region, deployment, version and artifact checksum are copied from the route the gateway used, so a
    request id traces to exactly what served it even after the deployment moves on.
    """

    request_id = models.CharField(max_length=64, unique=True)
    tenant = models.ForeignKey("controlplane.Tenant", on_delete=models.PROTECT, related_name="usage")
    model_name = models.CharField(max_length=100)
    region = models.CharField(max_length=41)
    deployment = models.ForeignKey(
        "regions.Deployment", null=True, blank=True, on_delete=models.SET_NULL, related_name="usage"
    )
    version = models.CharField(max_length=200)
    artifact_sha256 = models.CharField(max_length=64, blank=True)
    endpoint = models.CharField(max_length=500, blank=True)
    status = models.PositiveSmallIntegerField()
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.FloatField()
    attempts = models.PositiveSmallIntegerField(default=1)
    stream = models.BooleanField(default=False)
    started_at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["tenant", "started_at"])]

    def __str__(self) -> str:
        return self.request_id
